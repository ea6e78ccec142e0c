-- Doctor check (metadata only): each episode's clip in its mp4 lasts length / fps
-- (to_timestamp - from_timestamp), the first clip of a file starts at 0, and each later clip starts where the
-- previous one in the same file ended.
--
-- params:
--   tolerance_s (float, default 1e-4): allowed difference, seconds
-- returns: one row per bad clip: video_key VARCHAR, episode_index BIGINT, path VARCHAR, from_timestamp DOUBLE,
--   to_timestamp DOUBLE, length BIGINT, expected_duration_s DOUBLE, previous_to_timestamp DOUBLE, problem VARCHAR.
--   No rows means the check passed.
WITH v AS (
  SELECT v.video_key, v.episode_index, v.path, v.from_timestamp, v.to_timestamp, e.length,
         e.length / (SELECT fps FROM info) AS expected_duration_s,
         lag(v.to_timestamp) OVER (PARTITION BY v.video_key, v.path ORDER BY v.from_timestamp, v.episode_index)
           AS previous_to_timestamp
  FROM videos v JOIN episodes e USING (episode_index)
), p AS (
  SELECT *, concat_ws('; ',
    CASE WHEN abs((to_timestamp - from_timestamp) - expected_duration_s) > $tolerance_s
         THEN 'clip lasts ' || round(to_timestamp - from_timestamp, 6) || ' s, length / fps is ' || round(expected_duration_s, 6) || ' s' END,
    CASE WHEN previous_to_timestamp IS NULL AND abs(from_timestamp) > $tolerance_s
         THEN 'first clip of the file starts at ' || round(from_timestamp, 6) || ' s, not 0' END,
    CASE WHEN previous_to_timestamp IS NOT NULL AND abs(from_timestamp - previous_to_timestamp) > $tolerance_s
         THEN 'starts at ' || round(from_timestamp, 6) || ' s but the previous clip ends at ' || round(previous_to_timestamp, 6) || ' s' END
  ) AS problem
  FROM v
)
SELECT * FROM p WHERE problem <> '' ORDER BY video_key, path, from_timestamp
