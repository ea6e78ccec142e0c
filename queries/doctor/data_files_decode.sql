-- Doctor check: every page of every data file decodes (a full scan of the frames view hashing each row, which
-- forces every column to be read). A damaged page (bit rot, an interrupted copy) otherwise shows only when an item
-- in its row group is read. When this check fails, the report names the files and row groups pyarrow cannot read.
--
-- returns: no rows when every page decodes; a failure arrives as the check's error.
SELECT count(*) AS n_rows
FROM frames f
WHERE hash(f) IS NULL
HAVING count(*) > 0
