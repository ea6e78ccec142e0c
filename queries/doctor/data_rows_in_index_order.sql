-- Doctor check: inside each data file the rows are in `index` order (each row's index above the row before it),
-- as lerobot writes them, so each episode is one block of rows in frame order. Readers locate a frame's
-- neighbours (delta_timestamps) and an episode's runs by position (lerobot does too): rows out of order give other
-- frames there. Gaps and repeats of `index` are index_contiguous's.
--
-- returns: one row per row whose index is not above the row before it in its file: data_file VARCHAR, row BIGINT
--   (0-based row of the file), index BIGINT, previous_index BIGINT (the index of the row before), episode_index
--   BIGINT, previous_episode_index BIGINT, problem VARCHAR. No rows means the check passed.
WITH f AS (
  SELECT data_file, row, index, episode_index,
         lag(index) OVER w AS previous_index, lag(episode_index) OVER w AS previous_episode_index
  FROM _frames_loc
  WINDOW w AS (PARTITION BY data_file ORDER BY row)
)
SELECT data_file, row, index, previous_index, episode_index, previous_episode_index,
       'row ' || row || ' holds index ' || index || ' (episode ' || episode_index || ') after index ' ||
       previous_index || ' (episode ' || previous_episode_index || ') in the row before' AS problem
FROM f
WHERE index <= previous_index
ORDER BY data_file, row
