-- Doctor check (video index, warning): the frame rate info.json's features give a camera (its info's video.fps,
-- features.fps) is the rate of each of its mp4s, measured from the frames' real pts (the median spacing), within 1%.
-- The readers look frames up by time at the dataset's fps (info.json's top-level fps, which video_stream_rate
-- checks against the streams) and never read video.fps, so a wrong value misleads only the tools that trust it.
--
-- returns: one row per disagreeing file: video_key VARCHAR, path VARCHAR, frames BIGINT, info_video_fps DOUBLE,
--   stream_fps DOUBLE. No rows means the check passed.
WITH d AS (
  SELECT video_key, path, pts_s - lag(pts_s) OVER (PARTITION BY video_key, path ORDER BY frame) AS dt
  FROM video_frames
), r AS (
  SELECT video_key, path, count(*) + 1 AS frames, median(dt) AS median_dt FROM d WHERE dt IS NOT NULL GROUP BY ALL
)
SELECT r.video_key, r.path, r.frames, f.fps AS info_video_fps, round(1 / r.median_dt, 3) AS stream_fps
FROM r JOIN features f ON f.name = r.video_key
WHERE f.fps IS NOT NULL AND r.median_dt > 0 AND abs(1 / r.median_dt - f.fps) > 0.01 * f.fps
ORDER BY r.video_key, r.path
