-- Doctor check: the data files' global `index` runs 0..total_frames-1, each value once, and the row count
-- equals info.json total_frames.
--
-- returns: one row per violation: index BIGINT (NULL for the count row), expected BIGINT, episode_index BIGINT,
--   problem VARCHAR. No rows means the check passed.
WITH f AS (
  SELECT index, episode_index, row_number() OVER (ORDER BY index) - 1 AS expected FROM frames
)
SELECT index, expected, episode_index, 'index should be ' || expected || ' (0..n-1 without gaps or repeats)' AS problem
FROM f
WHERE index IS DISTINCT FROM expected
UNION ALL
SELECT NULL, i.total_frames, NULL,
       'info.json total_frames is ' || i.total_frames || ' but the data files hold ' || n.n || ' rows'
FROM info i, (SELECT count(*) AS n FROM frames) n
WHERE i.total_frames IS NOT NULL AND i.total_frames <> n.n
ORDER BY 1 NULLS FIRST
