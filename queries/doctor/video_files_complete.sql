-- Doctor check: no mp4 is shorter than its own sample table says: the last byte of its last packet (from the video
-- index, built from the container's `moov` box) lies within the file. A truncated download or copy keeps a valid
-- `moov` at the front, so the file opens and early frames decode, while frames past the cut fail.
--
-- returns: one row per truncated file: video_key VARCHAR, path VARCHAR, size_bytes BIGINT, bytes_needed BIGINT
--   (end of the last packet), frames_past_end BIGINT. No rows means the check passed.
SELECT v.video_key, v.path, d.size_bytes, max(v.byte_offset + v.byte_size) AS bytes_needed,
       count(*) FILTER (WHERE v.byte_offset + v.byte_size > d.size_bytes) AS frames_past_end
FROM video_frames v JOIN video_files d ON d.video_key = v.video_key AND d.path = v.path
GROUP BY v.video_key, v.path, d.size_bytes
HAVING max(v.byte_offset + v.byte_size) > d.size_bytes
ORDER BY v.video_key, v.path
