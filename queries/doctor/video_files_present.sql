-- Doctor check: every mp4 named by the videos view exists. Reads the view video_files, whose rows the Database
-- probes on first use (existence and size of each distinct path; on remote datasets one metadata request each).
--
-- returns: one row per missing file: video_key VARCHAR, path VARCHAR (relative to the dataset root),
--   n_episodes BIGINT, first_episode BIGINT. No rows means the check passed.
SELECT v.video_key, v.path, count(*) AS n_episodes, min(v.episode_index) AS first_episode
FROM videos v JOIN video_files d ON d.video_key = v.video_key AND d.path = v.path
WHERE NOT d.present
GROUP BY v.video_key, v.path
ORDER BY v.video_key, v.path
