-- Doctor check: each 1-D vector feature (not a camera) that has `names` in info.json lists one name per element:
-- a list of shape[1] strings, also inside a one-key dict ({"motors": [...]}) or one nested list ([[...]]), as
-- lerobot writes them. Otherwise frames_ext gives the feature no named element columns.
--
-- returns: one row per feature: name VARCHAR, shape BIGINT[], n_names BIGINT (the names listed; NULL when they
--   are not a list), names JSON, problem VARCHAR. No rows means the check passed.
WITH f AS (
  SELECT name, shape, names,
         CASE WHEN json_type(names) = 'OBJECT' AND len(json_extract(names, '$.*')) = 1
              THEN json_extract(names, '$.*')[1] ELSE names END AS listed
  FROM features
  WHERE NOT is_video AND dtype NOT IN ('video', 'image') AND len(shape) = 1 AND json_type(names) <> 'NULL'
), g AS (
  SELECT name, shape, names,
         CASE WHEN json_type(listed) = 'ARRAY' AND json_array_length(listed) = 1 AND json_type(listed, '$[0]') = 'ARRAY'
              THEN json_extract(listed, '$[0]') ELSE listed END AS listed
  FROM f
)
SELECT name, shape, CASE WHEN json_type(listed) = 'ARRAY' THEN json_array_length(listed) END AS n_names, names,
       CASE WHEN json_type(listed) <> 'ARRAY' THEN 'names is not a list of strings'
            ELSE 'names lists ' || json_array_length(listed) || ' name(s) for ' || shape[1] || ' elements'
       END AS problem
FROM g
WHERE json_type(listed) <> 'ARRAY' OR json_array_length(listed) <> shape[1]
ORDER BY name
