-- Doctor check: every episode has per-episode statistics min, max, mean, std and count for every feature except
-- string and language features (meta/episodes stats/<feature>/<stat> columns; v2.1: meta/episodes_stats.jsonl).
-- Quantiles (q01 ... q99) are not required: conversions from v2.1 lack them.
--
-- returns: one row per missing (feature, stat): feature VARCHAR, stat VARCHAR, n_episodes BIGINT (episodes
--   lacking it), first_episode BIGINT. No rows means the check passed.
WITH need AS (
  SELECT e.episode_index, f.name AS feature, s.stat
  FROM episodes e
  CROSS JOIN (SELECT name FROM features WHERE dtype NOT IN ('string', 'language')) f
  CROSS JOIN (SELECT unnest(['min', 'max', 'mean', 'std', 'count']) AS stat) s
), have AS (
  SELECT episode_index, feature, stat FROM episode_stats WHERE value IS NOT NULL AND len(value) > 0
)
SELECT n.feature, n.stat, count(*) AS n_episodes, min(n.episode_index) AS first_episode
FROM need n ANTI JOIN have h ON h.episode_index = n.episode_index AND h.feature = n.feature AND h.stat = n.stat
GROUP BY n.feature, n.stat
ORDER BY n.feature, n.stat
