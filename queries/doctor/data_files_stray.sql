-- Doctor check: every Parquet file under data/*/ is one of the dataset's data files: its name matches info.json's
-- data_path, and an episode of meta/episodes (v2.x: meta/episodes.jsonl) names it, or it holds the only rows of
-- one. Others (raw recorder output, even when named like an episode file; a copy of a data file left by a
-- half-finished merge) are not read: frames would get rows with NULL episode_index, or every copied frame twice.
-- They only mislead tools that read data/ whole.
--
-- returns: one row per stray file: path VARCHAR (relative to the dataset root), reason VARCHAR (why it is not
--   read). No rows means the check passed.
SELECT path, reason
FROM _data_files_stray
ORDER BY path
