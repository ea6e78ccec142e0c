-- Doctor check (video index, warning): each mp4's frame rate, measured from its frames' real pts (the median
-- spacing), is info.json's fps within 1%. Readers look frames up by time (from_timestamp + timestamp against the
-- real pts, never frame counts at the nominal rate), so a stream of another rate (a 25 fps mp4 behind a 10 fps
-- dataset) is read by time: where its frames do not fall on the data's timestamps the items raise
-- FrameNotFoundError (video_frame_pts lists those frames), and clip lengths no longer count the episode's frames.
--
-- returns: one row per file of another rate: video_key VARCHAR, path VARCHAR, frames BIGINT, info_fps DOUBLE,
--   stream_fps DOUBLE. No rows means the check passed.
WITH d AS (
  SELECT video_key, path, pts_s - lag(pts_s) OVER (PARTITION BY video_key, path ORDER BY frame) AS dt
  FROM video_frames
), r AS (
  SELECT video_key, path, count(*) + 1 AS frames, median(dt) AS median_dt FROM d WHERE dt IS NOT NULL GROUP BY ALL
)
SELECT video_key, path, frames, CAST((SELECT fps FROM info) AS DOUBLE) AS info_fps,
       round(1 / median_dt, 3) AS stream_fps
FROM r
WHERE median_dt > 0 AND abs(1 / median_dt - (SELECT fps FROM info)) > 0.01 * (SELECT fps FROM info)
ORDER BY video_key, path
