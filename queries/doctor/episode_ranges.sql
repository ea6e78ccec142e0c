-- Doctor check: each episode's metadata agrees with its rows in the data files: `length` equals the number of
-- rows found by episode_index, [dataset_from_index, dataset_to_index) is the range of their `index`, and
-- dataset_from_index is the sum of the lengths of the episodes before it. Catches scrambled index ranges
-- (as some dataset converters write them) and missing or extra rows. lerobot_sql itself locates rows by episode_index.
--
-- returns: one row per bad episode: episode_index BIGINT, length BIGINT, rows_found BIGINT,
--   dataset_from_index BIGINT, dataset_to_index BIGINT, first_index BIGINT, end_index BIGINT (max index + 1),
--   expected_from_index BIGINT, problem VARCHAR. No rows means the check passed.
WITH a AS (
  SELECT episode_index, count(*) AS n, min(index) AS lo, max(index) + 1 AS hi FROM frames GROUP BY episode_index
), e AS (
  SELECT episode_index, length, dataset_from_index, dataset_to_index,
         coalesce(sum(length) OVER (ORDER BY episode_index ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
           AS expected_from
  FROM episodes
), j AS (
  SELECT coalesce(e.episode_index, a.episode_index) AS episode_index, e.length, a.n AS rows_found,
         e.dataset_from_index, e.dataset_to_index, a.lo AS first_index, a.hi AS end_index,
         e.expected_from AS expected_from_index,
         concat_ws('; ',
           CASE WHEN e.episode_index IS NULL THEN 'rows in the data files but no episode metadata' END,
           CASE WHEN e.episode_index IS NOT NULL AND a.n IS NULL THEN 'no rows in the data files' END,
           CASE WHEN a.n IS NOT NULL AND e.length IS DISTINCT FROM a.n
                THEN 'length ' || e.length || ' but ' || a.n || ' rows found' END,
           CASE WHEN a.n IS NOT NULL AND a.hi - a.lo <> a.n THEN 'the rows'' index values are not contiguous' END,
           CASE WHEN a.n IS NOT NULL AND (e.dataset_from_index IS DISTINCT FROM a.lo OR e.dataset_to_index IS DISTINCT FROM a.hi)
                THEN 'metadata range [' || coalesce(e.dataset_from_index::VARCHAR, 'NULL') || ', ' ||
                     coalesce(e.dataset_to_index::VARCHAR, 'NULL') || ') but rows have index [' || a.lo || ', ' || a.hi || ')' END,
           CASE WHEN e.dataset_to_index - e.dataset_from_index <> e.length THEN 'dataset_to_index - dataset_from_index <> length' END,
           CASE WHEN e.dataset_from_index <> e.expected_from
                THEN 'dataset_from_index should be ' || e.expected_from || ' (sum of earlier lengths)' END
         ) AS problem
  FROM e FULL JOIN a ON e.episode_index = a.episode_index
)
SELECT * FROM j WHERE problem <> '' ORDER BY episode_index
