-- Doctor check: every task_index used by a frame exists in the tasks table, every task text listed in an
-- episode's `tasks` exists there too, and info.json total_tasks equals the number of tasks.
--
-- returns: one row per missing task: source VARCHAR ('frames', 'episodes', or 'info' for the count row),
--   task_index BIGINT, task VARCHAR, n_frames BIGINT (frames using it; NULL for episodes), first_episode BIGINT,
--   problem VARCHAR. No rows means the check passed.
SELECT 'frames' AS source, f.task_index, NULL::VARCHAR AS task, count(*) AS n_frames,
       min(f.episode_index) AS first_episode, 'task_index ' || coalesce(f.task_index::VARCHAR, 'NULL') || ' is not in the tasks table' AS problem
FROM frames f ANTI JOIN tasks t ON t.task_index = f.task_index
GROUP BY f.task_index
UNION ALL
SELECT 'episodes', NULL, e.task, NULL, min(e.episode_index), 'task ' || e.task || ' is listed in meta/episodes but not in the tasks table'
FROM (SELECT episode_index, unnest(tasks) AS task FROM episodes) e ANTI JOIN tasks t ON t.task = e.task
GROUP BY e.task
UNION ALL
SELECT 'info', NULL, NULL, NULL, NULL,
       'info.json total_tasks is ' || i.total_tasks || ' but the tasks table has ' || n.n || ' tasks'
FROM info i, (SELECT count(*) AS n FROM tasks) n
WHERE i.total_tasks IS NOT NULL AND i.total_tasks <> n.n
ORDER BY 1, 2, 3
