-- Doctor check (warning): the codec info.json declares for a camera (features.codec) is the codec of each of its
-- mp4 streams (video_files.codec, probed from the file's header). Readers decode what the file holds, so a wrong
-- label only misleads; third-party writers have labelled mpeg4 streams h264.
--
-- returns: one row per disagreeing file: video_key VARCHAR, path VARCHAR, info_codec VARCHAR, file_codec VARCHAR.
--   No rows means the check passed.
SELECT d.video_key, d.path, f.codec AS info_codec, d.codec AS file_codec
FROM video_files d JOIN features f ON f.name = d.video_key
WHERE d.codec IS NOT NULL AND f.codec IS NOT NULL AND lower(f.codec) <> lower(d.codec)
ORDER BY d.video_key, d.path
