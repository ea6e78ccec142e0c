-- Doctor check (video index): each episode's clip [from_timestamp, to_timestamp) of its mp4 holds exactly
-- `length` frames, counted from the frames' real pts (view video_frames, built by demuxing). A clip whose
-- to_timestamp is from_timestamp + (length - 1) / fps (video_segments_end_convention) ends one frame later.
-- Clips without bounds (NULL from/to_timestamp: video_pointers_present names them) and clips of missing mp4s
-- (video_files_present names them) have no frames to count and are left out.
--
-- params:
--   tolerance_s (float, default 1e-4): the clip bounds are shifted down by this much, seconds
-- returns: one row per bad clip: video_key VARCHAR, episode_index BIGINT, path VARCHAR, length BIGINT,
--   frames_in_clip BIGINT, from_timestamp DOUBLE, to_timestamp DOUBLE. No rows means the check passed.
SELECT v.video_key, v.episode_index, v.path, e.length, count(vf.pts) AS frames_in_clip, v.from_timestamp, v.to_timestamp
FROM videos v
JOIN episodes e USING (episode_index)
JOIN video_files d ON d.video_key = v.video_key AND d.path = v.path AND d.present
LEFT JOIN video_frames vf
  ON vf.video_key = v.video_key AND vf.path = v.path
 AND vf.pts_s >= v.from_timestamp - $tolerance_s
 AND vf.pts_s < v.to_timestamp - $tolerance_s
     + CASE WHEN abs((v.to_timestamp - v.from_timestamp) - (e.length - 1) / (SELECT fps FROM info)) <= $tolerance_s
            THEN 1 / (SELECT fps FROM info) ELSE 0 END
WHERE v.from_timestamp IS NOT NULL AND v.to_timestamp IS NOT NULL
GROUP BY ALL
HAVING count(vf.pts) <> e.length
ORDER BY v.video_key, v.episode_index
