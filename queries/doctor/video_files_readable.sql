-- Doctor check: every mp4 named by the videos view that exists can be opened as a video: not empty (zero bytes, a
-- download that never wrote), and PyAV finds exactly one video stream in it (the view video_files has its codec,
-- NULL when it cannot be opened, and its count of video streams). A file of several video streams (a recorder's
-- file muxing all cameras) is refused by every reader: nothing says which stream is the camera's. Audio streams are
-- not counted. A file that fails here makes every video index check skip, so it must fail on its own.
--
-- returns: one row per unreadable file: video_key VARCHAR, path VARCHAR (relative to the dataset root),
--   size_bytes BIGINT, n_episodes BIGINT, first_episode BIGINT, problem VARCHAR. No rows means the check passed.
SELECT v.video_key, v.path, d.size_bytes, count(*) AS n_episodes, min(v.episode_index) AS first_episode,
       CASE WHEN d.size_bytes = 0 THEN 'empty file (0 bytes)'
            WHEN d.codec IS NULL THEN 'PyAV finds no readable video stream (truncated before its header, or not an mp4)'
            ELSE 'holds ' || d.video_streams || ' video streams, not one per camera file: keep the camera''s own '
                 || 'stream N with ffmpeg -i FILE -map 0:v:N -map 0:a? -c copy fixed.mp4' END AS problem
FROM videos v JOIN video_files d ON d.video_key = v.video_key AND d.path = v.path
WHERE d.present AND (d.size_bytes = 0 OR d.codec IS NULL OR d.video_streams > 1)
GROUP BY v.video_key, v.path, d.size_bytes, d.codec, d.video_streams
ORDER BY v.video_key, v.path
