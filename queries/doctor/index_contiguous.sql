-- Doctor check: the data files' global `index` runs 0..total_frames-1, each value once, and the row count
-- equals info.json total_frames.
--
-- returns: one row per discontinuity: index BIGINT (NULL for the count row), previous_index BIGINT (the index
--   before it in sorted order), episode_index BIGINT, problem VARCHAR. No rows means the check passed.
WITH f AS (
  SELECT index, episode_index, lag(index) OVER (ORDER BY index) AS previous_index FROM frames
)
SELECT index, previous_index, episode_index,
       CASE WHEN index IS NULL THEN 'a row has no index'
            WHEN previous_index IS NULL THEN 'the first index is ' || index || ', not 0'
            WHEN index = previous_index THEN 'index ' || index || ' appears more than once'
            ELSE 'index jumps from ' || previous_index || ' to ' || index
       END AS problem
FROM f
WHERE index IS NULL OR (previous_index IS NULL AND index <> 0) OR index <> previous_index + 1
UNION ALL
SELECT NULL, NULL, NULL,
       'info.json total_frames is ' || i.total_frames || ' but the data files hold ' || n.n || ' rows'
FROM info i, (SELECT count(*) AS n FROM frames) n
WHERE i.total_frames IS NOT NULL AND i.total_frames <> n.n
ORDER BY 1 NULLS FIRST
