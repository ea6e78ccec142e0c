-- Doctor check: inside each episode, frame_index = index - (the episode's first index), i.e. 0..length-1 in
-- index order, and timestamp is frame_index / fps within the tolerance (the recorder writes exactly that).
--
-- params:
--   tolerance_s (float, default 1e-4): allowed |timestamp - frame_index / fps|, seconds
-- returns: one row per bad frame: episode_index BIGINT, index BIGINT, frame_index BIGINT, expected_frame_index
--   BIGINT, timestamp FLOAT, problem VARCHAR. No rows means the check passed.
WITH f AS (
  SELECT episode_index, index, frame_index, timestamp,
         index - min(index) OVER (PARTITION BY episode_index) AS expected
  FROM frames
)
SELECT episode_index, index, frame_index, expected AS expected_frame_index, timestamp,
       CASE WHEN frame_index IS DISTINCT FROM expected
            THEN 'frame_index should be ' || expected || ' (index - first index of the episode)'
            ELSE 'timestamp ' || timestamp || ' s is not frame_index / fps = ' || round(frame_index / (SELECT fps FROM info), 6) || ' s'
       END AS problem
FROM f
WHERE frame_index IS DISTINCT FROM expected
   OR abs(CAST(timestamp AS DOUBLE) - frame_index / (SELECT fps FROM info)) > $tolerance_s
ORDER BY episode_index, index
