-- Episodes with a task whose text contains a string, case-insensitively (any of the episode's tasks counts, so an
-- episode that switches task mid-way matches either task).
--
-- params:
--   text (str): the substring to look for, e.g. cube
-- returns: episode_index BIGINT, one row per matching episode, ascending.
SELECT episode_index
FROM episodes
WHERE len(list_filter(tasks, lambda t: contains(lower(t), lower($text)))) > 0
ORDER BY episode_index
