-- Doctor check (metadata only, warning): clips whose to_timestamp is from_timestamp + (length - 1) / fps, the
-- presentation time of the clip's last frame rather than the end of its last frame (lerobot writes length / fps).
-- Both lerobot and lerobot_sql decode such clips correctly (frames are found from from_timestamp); tools that read
-- [from_timestamp, to_timestamp) as the clip's span lose its last frame.
--
-- params:
--   tolerance_s (float, default 1e-4): allowed difference, seconds
-- returns: one row per such clip: video_key VARCHAR, episode_index BIGINT, path VARCHAR, from_timestamp DOUBLE,
--   to_timestamp DOUBLE, length BIGINT. No rows means the check passed.
SELECT v.video_key, v.episode_index, v.path, v.from_timestamp, v.to_timestamp, e.length
FROM videos v JOIN episodes e USING (episode_index)
WHERE e.length > 1
  AND abs((v.to_timestamp - v.from_timestamp) - (e.length - 1) / (SELECT fps FROM info)) <= $tolerance_s
ORDER BY v.video_key, v.path, v.from_timestamp
