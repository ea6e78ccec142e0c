-- Doctor check (metadata only): each episode's clip in its mp4 lasts length / fps
-- (to_timestamp - from_timestamp), the first clip of a file starts at 0, and each later clip starts where the
-- previous one in the same file ended. Clips written with to_timestamp = from_timestamp + (length - 1) / fps (a
-- third-party convention both readers decode correctly: the next clip then starts one frame after it) are not
-- errors here; video_segments_end_convention lists them as a warning.
--
-- params:
--   tolerance_s (float, default 1e-4): allowed difference, seconds
-- returns: one row per bad clip: video_key VARCHAR, episode_index BIGINT, path VARCHAR, from_timestamp DOUBLE,
--   to_timestamp DOUBLE, length BIGINT, expected_duration_s DOUBLE, previous_to_timestamp DOUBLE, problem VARCHAR.
--   No rows means the check passed.
WITH v AS (
  SELECT v.video_key, v.episode_index, v.path, v.from_timestamp, v.to_timestamp, e.length,
         e.length / (SELECT fps FROM info) AS expected_duration_s,
         lag(v.to_timestamp) OVER o AS previous_to_timestamp,
         -- the (length - 1) / fps convention, for this clip and the previous one in the file
         abs((v.to_timestamp - v.from_timestamp) - (e.length - 1) / (SELECT fps FROM info)) <= $tolerance_s AS short_end,
         lag(abs((v.to_timestamp - v.from_timestamp) - (e.length - 1) / (SELECT fps FROM info)) <= $tolerance_s) OVER o
           AS previous_short_end
  FROM videos v JOIN episodes e USING (episode_index)
  WINDOW o AS (PARTITION BY v.video_key, v.path ORDER BY v.from_timestamp, v.episode_index)
), p AS (
  SELECT video_key, episode_index, path, from_timestamp, to_timestamp, length, expected_duration_s,
         previous_to_timestamp, concat_ws('; ',
    CASE WHEN abs((to_timestamp - from_timestamp) - expected_duration_s) > $tolerance_s AND NOT short_end
         THEN 'clip lasts ' || round(to_timestamp - from_timestamp, 6) || ' s, length / fps is ' || round(expected_duration_s, 6) || ' s' END,
    CASE WHEN previous_to_timestamp IS NULL AND abs(from_timestamp) > $tolerance_s
         THEN 'first clip of the file starts at ' || round(from_timestamp, 6) || ' s, not 0' END,
    CASE WHEN previous_to_timestamp IS NOT NULL AND abs(from_timestamp - previous_to_timestamp) > $tolerance_s
              AND NOT (previous_short_end AND abs(from_timestamp - previous_to_timestamp - 1 / (SELECT fps FROM info)) <= $tolerance_s)
         THEN 'starts at ' || round(from_timestamp, 6) || ' s but the previous clip ends at ' || round(previous_to_timestamp, 6) || ' s' END
  ) AS problem
  FROM v
)
SELECT * FROM p WHERE problem <> '' ORDER BY video_key, path, from_timestamp
