-- Doctor check: every data file meta/episodes points to (data/chunk_index, data/file_index through info.json's
-- data_path) exists under data/. A missing file's episodes have no rows: the frames view and every query over it
-- silently lack them, and their items raise MissingFileError.
--
-- returns: one row per missing file: path VARCHAR (relative to the dataset root), n_episodes BIGINT,
--   first_episode BIGINT. No rows means the check passed.
SELECT path, count(*) AS n_episodes, min(episode_index) AS first_episode
FROM _episode_data_files
WHERE path NOT IN (SELECT path FROM _data_files_listed)
GROUP BY path
ORDER BY path
