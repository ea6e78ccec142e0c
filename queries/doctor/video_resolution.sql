-- Doctor check (warning): each mp4's frame size (video_files.height / width, from the stream's header) is the one
-- info.json declares for its camera: the feature's shape ([H, W, C] as lerobot writes it; [C, H, W] when its names
-- start with a channel, or without names when only the first side looks like a channel count, as the readers take
-- it) and, where info.json has them, its info's video.height / video.width. The readers serve each file's own size,
-- as lerobot does (dataset() warns), so items are the right frames in another shape than the declared one: policies
-- built from info.json's shapes and batches that mix files of two sizes get frames of a size they do not expect.
--
-- returns: one row per disagreeing file: video_key VARCHAR, path VARCHAR, declared_shape BIGINT[], info_height
--   BIGINT, info_width BIGINT (video.height / width, NULL when absent), file_height BIGINT, file_width BIGINT.
--   No rows means the check passed.
WITH f AS (
  SELECT name, shape, height AS info_height, width AS info_width,
         CASE WHEN json_type(names) = 'ARRAY' AND json_array_length(names) > 0
              THEN starts_with(coalesce(names ->> 0, ''), 'channel')
              ELSE shape[1] IN (1, 3, 4) AND shape[3] NOT IN (1, 3, 4) END AS chw
  FROM features WHERE is_video
), d AS (
  SELECT name, shape, info_height, info_width,
         CASE WHEN len(shape) = 2 THEN shape[1] WHEN len(shape) = 3 THEN (CASE WHEN chw THEN shape[2] ELSE shape[1] END)
         END AS shape_height,
         CASE WHEN len(shape) = 2 THEN shape[2] WHEN len(shape) = 3 THEN (CASE WHEN chw THEN shape[3] ELSE shape[2] END)
         END AS shape_width
  FROM f
)
SELECT v.video_key, v.path, d.shape AS declared_shape, d.info_height, d.info_width, v.height AS file_height,
       v.width AS file_width
FROM video_files v JOIN d ON d.name = v.video_key
WHERE v.height IS NOT NULL AND (
      (d.shape_height IS NOT NULL AND (d.shape_height <> v.height OR d.shape_width <> v.width))
   OR d.info_height <> v.height OR d.info_width <> v.width)
ORDER BY v.video_key, v.path
