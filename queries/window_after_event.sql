-- The window of given length that starts at the first frame where a predicate holds, per episode ("the 1 s after
-- contact"). The event frame is included; the window is clipped at the episode end.
--
-- params:
--   predicate (expr): a condition over the columns of frames_ext, e.g. "observation.state.gripper.pos" < 20
--   seconds (float, default 2.0, > 0): window length, seconds
-- returns: episode_index BIGINT, start_s DOUBLE, end_s DOUBLE (half-open [start_s, end_s), seconds from the episode
--   start; start_s = the event's timestamp), event_s DOUBLE.
SELECT episode_index, start_s, end_s, event_s
FROM event_windows($predicate, 0.0, $seconds)
ORDER BY episode_index
