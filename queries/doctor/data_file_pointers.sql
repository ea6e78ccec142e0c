-- Doctor check: each episode's data/chunk_index and data/file_index (formatted with info.json data_path) name the
-- file that actually holds its rows, and all its rows sit in that one file. Converters before Feb 2026 wrote
-- stale pointers on the first episode of each new data file (issue #2401); lerobot_sql finds rows by
-- episode_index, so a mismatch does not change what it reads, but other readers trust the pointer.
--
-- returns: one row per bad episode: episode_index BIGINT, pointed_file VARCHAR, actual_files VARCHAR[],
--   problem VARCHAR. No rows means the check passed.
WITH fmt AS (
  SELECT regexp_replace(regexp_replace(data_path,
           '\{(?:chunk_index|episode_chunk)(?::(0?\d*)d)?\}', '%1$\1d', 'g'),
           '\{(?:file_index|episode_index)(?::(0?\d*)d)?\}', '%2$\1d', 'g') AS f
  FROM info
), actual AS (
  SELECT episode_index, list(DISTINCT data_file ORDER BY data_file) AS files FROM _frames_loc GROUP BY episode_index
), pointed AS (
  SELECT ep.episode_index, printf(fmt.f, ep."data/chunk_index", ep."data/file_index") AS pointed_file
  FROM episodes ep, fmt
)
SELECT p.episode_index, p.pointed_file, a.files AS actual_files,
       CASE WHEN len(a.files) > 1 THEN 'rows are spread over ' || len(a.files) || ' data files'
            ELSE 'data/chunk_index, data/file_index point to ' || p.pointed_file || ' but the rows are in ' || a.files[1]
       END AS problem
FROM pointed p JOIN actual a USING (episode_index)
WHERE len(a.files) > 1 OR p.pointed_file IS DISTINCT FROM a.files[1]
ORDER BY p.episode_index
