-- Episodes whose per-episode statistic of a feature lies in a range, from meta/episodes (view episode_stats).
-- Every element must be in range, or only the named one. Example: action bounds, i.e. episodes whose action never
-- leaves [-100, 100]: two calls (stat=max, max_value=100) and (stat=min, min_value=-100), or one call per element.
--
-- params:
--   feature (str, default action): feature key, as in meta/episodes (stats/<feature>/<stat>)
--   stat (str, default max): min, max, mean, std, count or a quantile such as q01 / q99
--   min_value (float, default -inf): lower bound, inclusive
--   max_value (float, default inf): upper bound, inclusive
--   element (str, default ''): one element name from info.json `names` (e.g. gripper.pos); empty = every element
-- returns: episode_index BIGINT, one row per matching episode, ascending. Raises if the feature/stat pair has no
--   statistics (the error lists the pairs via: SELECT DISTINCT feature, stat FROM episode_stats).
-- The final aggregate always yields one row, so an unknown feature/stat raises instead of returning nothing.
WITH s AS (
  SELECT episode_index, value FROM episode_stats WHERE feature = $feature AND stat = $stat
), picked AS (
  SELECT episode_index,
         list_bool_and(list_transform(
           CASE WHEN $element = '' THEN value ELSE [value[element_index($feature, $element)]] END,
           lambda x: x BETWEEN $min_value AND $max_value)) AS ok
  FROM s
)
SELECT unnest(CASE WHEN count(*) = 0
                   THEN error('episodes_by_stat: no statistic ' || $stat || ' for feature ' || $feature ||
                              '; list them with SELECT DISTINCT feature, stat FROM episode_stats')
                   ELSE coalesce(list(episode_index ORDER BY episode_index) FILTER (WHERE ok), []) END) AS episode_index
FROM picked
