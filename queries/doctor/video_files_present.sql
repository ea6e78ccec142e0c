-- Doctor check: every mp4 named by the videos view exists. File existence is not SQL: the doctor first probes
-- each distinct path and fills the table _doctor_video_files (video_key, path, present, codec), which this
-- query reads (run it through `lerobot-sql doctor` or lerobot_sql.doctor.run).
--
-- returns: one row per missing file: video_key VARCHAR, path VARCHAR (relative to the dataset root),
--   n_episodes BIGINT, first_episode BIGINT. No rows means the check passed.
SELECT v.video_key, v.path, count(*) AS n_episodes, min(v.episode_index) AS first_episode
FROM videos v JOIN _doctor_video_files d ON d.video_key = v.video_key AND d.path = v.path
WHERE NOT d.present
GROUP BY v.video_key, v.path
ORDER BY v.video_key, v.path
