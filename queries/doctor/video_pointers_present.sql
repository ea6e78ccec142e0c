-- Doctor check: every episode has a usable clip pointer for every video feature in meta/episodes:
-- videos/<key>/chunk_index, file_index, from_timestamp and to_timestamp, present and not NULL. Without them the
-- camera's frames cannot be located (tabular reads with cameras=[] still work), and the other video checks have no
-- file to look at.
--
-- returns: one row per camera with episodes lacking a pointer: video_key VARCHAR, n_episodes BIGINT,
--   first_episode BIGINT, problem VARCHAR. No rows means the check passed.
WITH e AS (SELECT DISTINCT episode_index FROM episodes WHERE episode_index IS NOT NULL),
bad AS (
  SELECT f.name AS video_key, e.episode_index
  FROM features f CROSS JOIN e
  WHERE f.is_video AND NOT EXISTS (
    SELECT 1 FROM videos v WHERE v.video_key = f.name AND v.episode_index = e.episode_index AND v.path IS NOT NULL
      AND v.from_timestamp IS NOT NULL AND v.to_timestamp IS NOT NULL)
)
SELECT video_key, count(*) AS n_episodes, min(episode_index) AS first_episode,
       'no usable videos/' || video_key || '/{chunk_index, file_index, from_timestamp, to_timestamp} in meta/episodes (a column missing or NULL)' AS problem
FROM bad GROUP BY video_key ORDER BY video_key
