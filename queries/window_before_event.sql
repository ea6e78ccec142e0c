-- The window of given length that ends at the first frame where a predicate holds, per episode ("the 2 s before
-- the gripper closes"). The event frame itself is excluded; the window is clipped at the episode start, and
-- episodes where the predicate never holds (or holds on the first frame) give no row.
--
-- params:
--   predicate (expr): a condition over the columns of frames_ext, e.g. "observation.state.gripper.pos" < 20
--   seconds (float, default 2.0, > 0): window length, seconds
-- returns: episode_index BIGINT, start_s DOUBLE, end_s DOUBLE (half-open [start_s, end_s), seconds from the episode
--   start; end_s = the event's timestamp), event_s DOUBLE.
SELECT episode_index, start_s, end_s, event_s
FROM event_windows($predicate, $seconds, 0.0)
ORDER BY episode_index
