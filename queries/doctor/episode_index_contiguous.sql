-- Doctor check: meta/episodes holds episode_index 0..N-1, each once, and N equals info.json total_episodes.
-- lerobot indexes the episodes table by position, so a gap or a repeat shifts every later episode.
--
-- returns: one row per violation: episode_index BIGINT (NULL for the count row), expected BIGINT,
--   problem VARCHAR. No rows means the check passed.
WITH e AS (
  SELECT episode_index, row_number() OVER (ORDER BY episode_index) - 1 AS expected,
         count(*) OVER (PARTITION BY episode_index) AS copies
  FROM episodes
)
SELECT episode_index, expected,
       CASE WHEN copies > 1 THEN 'episode_index appears ' || copies || ' times in meta/episodes'
            ELSE 'episode_index should be ' || expected || ' (0..N-1 without gaps)' END AS problem
FROM e
WHERE episode_index IS DISTINCT FROM expected OR copies > 1
UNION ALL
SELECT NULL, i.total_episodes,
       'info.json total_episodes is ' || i.total_episodes || ' but the episode metadata has ' || n.n || ' rows'
FROM info i, (SELECT count(*) AS n FROM episodes) n
WHERE i.total_episodes IS NOT NULL AND i.total_episodes <> n.n
ORDER BY 1 NULLS FIRST
