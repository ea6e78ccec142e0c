-- Segments where the arm is idle: maximal runs of consecutive frames whose speed (L2 norm of the frame-to-frame
-- velocity of a vector feature, units per second) is at most max_speed, lasting at least min_duration_s.
-- An episode's first frame has no velocity and is never idle.
--
-- params:
--   max_speed (float, default 1.0, >= 0): speed threshold, feature units per second (degrees/s for SO-101 joints)
--   min_duration_s (float, default 0.5, >= 0): shortest segment kept, seconds
--   feature (vector, default observation.state): a numeric vector feature of frames
-- returns: episode_index BIGINT, start_s DOUBLE, end_s DOUBLE (half-open, seconds from the episode start; end_s is
--   the last idle frame's timestamp + 1/fps), n_frames BIGINT.
WITH v AS (
  SELECT episode_index, frame_index, timestamp::DOUBLE AS t,
         vec_norm(vec_sub($feature, lag($feature) OVER w)) / (timestamp - lag(timestamp) OVER w) AS speed
  FROM frames
  WINDOW w AS (PARTITION BY episode_index ORDER BY frame_index)
), runs AS (
  SELECT *, frame_index - row_number() OVER (PARTITION BY episode_index ORDER BY frame_index) AS run
  FROM v WHERE speed <= $max_speed
), seg AS (
  SELECT episode_index, min(t) AS start_s, max(t) + 1.0 / any_value(i.fps) AS end_s, count(*) AS n_frames
  FROM runs, info i GROUP BY episode_index, run
)
SELECT episode_index, start_s, end_s, n_frames
FROM seg
-- float32 timestamps: a run lasting exactly min_duration_s must count
WHERE end_s - start_s >= $min_duration_s - 1e-4
ORDER BY episode_index, start_s
