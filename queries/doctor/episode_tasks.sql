-- Doctor check: each episode's `tasks` in meta/episodes (meta/episodes.jsonl for v2.x) lists exactly the task texts
-- its frames carry (their task_index in the tasks table), as lerobot writes them. Selections by task
-- (`list_contains(tasks, ...)`, the episodes_by_task query) read meta/episodes, while items carry the frames' own
-- task: a list that disagrees selects episodes whose items say another task, and misses the episodes that do.
--
-- returns: one row per episode whose lists differ: episode_index BIGINT, listed VARCHAR[] (meta/episodes, sorted),
--   used VARCHAR[] (the frames' task texts, sorted), problem VARCHAR. Episodes without frames, or with a frame whose
--   task_index is not in the tasks table (tasks_exist names those), are not compared. No rows means the check
--   passed.
WITH used AS (
  SELECT f.episode_index, list_sort(list(DISTINCT t.task) FILTER (WHERE t.task IS NOT NULL)) AS used
  FROM frames f LEFT JOIN tasks t ON t.task_index = f.task_index
  GROUP BY f.episode_index
  HAVING count(*) = count(t.task_index)
), listed AS (
  SELECT episode_index, list_sort(list_distinct(coalesce(tasks, []::VARCHAR[]))) AS listed FROM episodes
)
SELECT l.episode_index, l.listed, u.used,
       'meta/episodes lists ' || to_json(l.listed)::VARCHAR || ' but its frames carry ' || to_json(u.used)::VARCHAR
         AS problem
FROM listed l JOIN used u USING (episode_index)
WHERE l.listed IS DISTINCT FROM u.used
ORDER BY 1
