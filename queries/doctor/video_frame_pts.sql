-- Doctor check (video index): for every frame and camera, the video holds a frame whose real pts is within the
-- tolerance of from_timestamp + timestamp (where lerobot and lerobot_sql look). Catches from_timestamp offsets
-- that drift from the file (huggingface/lerobot issue #3177), clips missing frames and wrong video pointers.
-- Frames of clips without from_timestamp (video_pointers_present names them) or of missing mp4s
-- (video_files_present names them) have nothing to be compared with and are left out.
--
-- params:
--   tolerance_s (float, default 1e-4): allowed |pts - (from_timestamp + timestamp)|, seconds (lerobot's default)
-- returns: one row per frame without a match: video_key VARCHAR, episode_index BIGINT, frame_index BIGINT,
--   path VARCHAR, expected_s DOUBLE, nearest_pts_s DOUBLE, error_s DOUBLE. No rows means the check passed.
WITH q AS (
  SELECT v.video_key, v.path, f.episode_index, f.frame_index, v.from_timestamp + CAST(f.timestamp AS DOUBLE) AS t
  FROM frames f JOIN videos v USING (episode_index)
  JOIN video_files d ON d.video_key = v.video_key AND d.path = v.path AND d.present
  WHERE v.from_timestamp IS NOT NULL
), lo AS (
  SELECT q.*, vf.pts_s AS lo_s
  FROM q ASOF LEFT JOIN video_frames vf ON vf.video_key = q.video_key AND vf.path = q.path AND q.t >= vf.pts_s
), hi AS (
  SELECT lo.*, vf.pts_s AS hi_s
  FROM lo ASOF LEFT JOIN video_frames vf ON vf.video_key = lo.video_key AND vf.path = lo.path AND lo.t <= vf.pts_s
), e AS (
  SELECT *, least(coalesce(abs(t - lo_s), 'inf'::DOUBLE), coalesce(abs(hi_s - t), 'inf'::DOUBLE)) AS error_s FROM hi
)
SELECT video_key, episode_index, frame_index, path, t AS expected_s,
       CASE WHEN coalesce(abs(t - lo_s), 'inf'::DOUBLE) <= coalesce(abs(hi_s - t), 'inf'::DOUBLE) THEN lo_s ELSE hi_s END AS nearest_pts_s,
       error_s
FROM e
WHERE error_s > $tolerance_s
ORDER BY video_key, episode_index, frame_index
