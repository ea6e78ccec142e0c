-- Episodes whose length, in frames, lies in a range (both bounds inclusive).
--
-- params:
--   min_length (int, default 0, >= 0): shortest episode kept, frames
--   max_length (int, default 9223372036854775807): longest episode kept, frames
-- returns: episode_index BIGINT, one row per matching episode, ascending.
SELECT episode_index
FROM episodes
WHERE length BETWEEN $min_length AND $max_length
ORDER BY episode_index
