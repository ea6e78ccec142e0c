-- Doctor check (video index): each episode's clip is a run of its own frames in the mp4, as dataset() checks when it
-- opens. The clip starts at the first frame presented no earlier than half a frame before from_timestamp and holds
-- as many frames as the episode has rows in data/; it must start after the previous clip's frames, end before the
-- next clip's first frame and within the file (clips of one file ordered by from_timestamp; episodes without rows
-- hold no frames). to_timestamp is not read, so writers that store from_timestamp + (length - 1) / fps pass; a start
-- shifted by whole frames, which every per-frame lookup would silently follow, does not. Clips without
-- from_timestamp (video_pointers_present names them) and clips of mp4s that are not indexed (missing:
-- video_files_present) are left out.
--
-- returns: one row per bad clip: video_key VARCHAR, episode_index BIGINT, path VARCHAR, from_timestamp DOUBLE,
--   length BIGINT (rows in data/), first_frame BIGINT, last_frame BIGINT (frame ordinals in the file),
--   frames_in_file BIGINT, problem VARCHAR. No rows means the check passed.
WITH n AS (
  SELECT episode_index, count(*) AS length FROM frames GROUP BY episode_index
), nf AS (
  SELECT video_key, path, count(*) AS frames_in_file FROM video_frames GROUP BY ALL
), c AS (
  SELECT v.video_key, v.episode_index, v.path, v.from_timestamp, n.length,
         v.from_timestamp - 0.5 / (SELECT fps FROM info) AS t
  FROM videos v JOIN n USING (episode_index)
  WHERE v.from_timestamp IS NOT NULL
), r AS (
  SELECT c.*, coalesce(vf.frame, nf.frames_in_file) AS first_frame, nf.frames_in_file
  FROM c JOIN nf ON nf.video_key = c.video_key AND nf.path = c.path
  ASOF LEFT JOIN video_frames vf ON vf.video_key = c.video_key AND vf.path = c.path AND c.t <= vf.pts_s
), w AS (
  SELECT *, first_frame + length - 1 AS last_frame,
         lag(episode_index) OVER o AS prev_episode, lag(first_frame + length - 1) OVER o AS prev_last_frame,
         lead(episode_index) OVER o AS next_episode, lead(first_frame) OVER o AS next_first_frame
  FROM r WINDOW o AS (PARTITION BY video_key, path ORDER BY from_timestamp, episode_index)
), p AS (
  SELECT video_key, episode_index, path, from_timestamp, length, first_frame, last_frame, frames_in_file,
    concat_ws('; ',
      CASE WHEN last_frame >= frames_in_file
           THEN 'frames ' || first_frame || '..' || last_frame || ' run past the file''s last frame ' || (frames_in_file - 1) END,
      CASE WHEN prev_last_frame IS NOT NULL AND first_frame <= prev_last_frame
           THEN 'starts at frame ' || first_frame || ', inside the clip of episode ' || prev_episode || ' (which ends at frame ' || prev_last_frame || ')' END,
      CASE WHEN next_first_frame IS NOT NULL AND last_frame >= next_first_frame
           THEN 'frames ' || first_frame || '..' || last_frame || ' run into the clip of episode ' || next_episode || ' (which starts at frame ' || next_first_frame || ')' END
    ) AS problem
  FROM w
)
SELECT * FROM p WHERE problem <> '' ORDER BY video_key, path, from_timestamp
