-- Doctor check: meta/episodes holds episode_index 0..N-1, each once, and N equals info.json total_episodes.
-- lerobot indexes the episodes table by position, so a gap or a repeat shifts every later episode.
--
-- returns: one row per discontinuity: episode_index BIGINT (NULL for the count row), previous BIGINT (the
--   episode_index before it in sorted order), problem VARCHAR. No rows means the check passed.
WITH e AS (
  SELECT episode_index, lag(episode_index) OVER (ORDER BY episode_index) AS previous FROM episodes
)
SELECT episode_index, previous,
       CASE WHEN episode_index IS NULL THEN 'an episode row has no episode_index'
            WHEN previous IS NULL THEN 'the first episode_index is ' || episode_index || ', not 0'
            WHEN episode_index = previous THEN 'episode_index ' || episode_index || ' appears more than once'
            ELSE 'episode_index jumps from ' || previous || ' to ' || episode_index || ' (missing ' ||
                 (previous + 1) || CASE WHEN episode_index - previous > 2 THEN '..' || (episode_index - 1) ELSE '' END || ')'
       END AS problem
FROM e
WHERE episode_index IS NULL OR (previous IS NULL AND episode_index <> 0) OR episode_index <> previous + 1
UNION ALL
SELECT NULL, NULL,
       'info.json total_episodes is ' || i.total_episodes || ' but the episode metadata has ' || n.n || ' rows'
FROM info i, (SELECT count(*) AS n FROM episodes) n
WHERE i.total_episodes IS NOT NULL AND i.total_episodes <> n.n
ORDER BY 1 NULLS FIRST
