-- Doctor check: each episode's data/chunk_index and data/file_index (formatted with info.json data_path) name the
-- file that actually holds its rows, and all its rows sit in that one file. Converters before Feb 2026 wrote
-- stale pointers on the first episode of each new data file (huggingface/lerobot issue #2401); lerobot_sql finds rows by
-- episode_index, so a mismatch does not change what it reads, but other readers trust the pointer.
--
-- returns: one row per bad episode: episode_index BIGINT, pointed_file VARCHAR, actual_files VARCHAR[],
--   problem VARCHAR. No rows means the check passed.
-- The pointed file comes from the internal view _episode_data_files, which formats the pointers with info.json's
-- data_path at connect time (a printf format computed inside a query is refused by the query checks: its widths
-- could not be bounded before it runs).
WITH pointed AS (
  SELECT episode_index, path AS pointed_file FROM _episode_data_files
), actual AS (
  SELECT episode_index, list(DISTINCT data_file ORDER BY data_file) AS files FROM _frames_loc GROUP BY episode_index
)
SELECT p.episode_index, p.pointed_file, a.files AS actual_files,
       CASE WHEN len(a.files) > 1 THEN 'rows are spread over ' || len(a.files) || ' data files'
            ELSE 'data/chunk_index, data/file_index point to ' || p.pointed_file || ' but the rows are in ' || a.files[1]
       END AS problem
FROM pointed p JOIN actual a USING (episode_index)
WHERE len(a.files) > 1 OR p.pointed_file IS DISTINCT FROM a.files[1]
ORDER BY p.episode_index
