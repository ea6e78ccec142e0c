-- A deterministic train/validation split by hashing episode_index: an episode is in validation when the first 32
-- bits of md5(seed || ':' || episode_index), read as an unsigned integer and divided by 2^32, are below
-- validation_fraction. The same seed gives the same split on any machine and any DuckDB version, and an episode
-- never moves when episodes are added. In Python: int(hashlib.md5(f"{seed}:{ep}".encode()).hexdigest()[:8], 16) / 2**32.
--
-- params:
--   subset (str, default train): train or validation
--   validation_fraction (float, default 0.1): expected share of episodes in validation, 0..1
--   seed (str, default 0): any string; change it to draw another split
-- returns: episode_index BIGINT, one row per episode of the subset, ascending.
SELECT episode_index
FROM episodes
WHERE CASE WHEN $subset NOT IN ('train', 'validation')
           THEN error('split: subset must be train or validation, got ' || $subset)
           WHEN $validation_fraction < 0 OR $validation_fraction > 1
           THEN error('split: validation_fraction must lie in [0, 1]')
           ELSE (('0x' || left(md5($seed || ':' || episode_index::VARCHAR), 8))::UBIGINT / 4294967296.0
                 < $validation_fraction) = ($subset = 'validation') END
ORDER BY episode_index
