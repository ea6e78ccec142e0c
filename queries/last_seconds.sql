-- The last N seconds of each episode (the whole episode if it is shorter).
--
-- params:
--   seconds (float, default 1.0, > 0): window length, seconds
-- returns: episode_index BIGINT, start_s DOUBLE, end_s DOUBLE (half-open [duration_s - seconds, duration_s),
--   seconds from the episode start; duration_s = length / fps).
SELECT episode_index, greatest(duration_s - $seconds, 0.0) AS start_s, duration_s AS end_s
FROM episodes
ORDER BY episode_index
