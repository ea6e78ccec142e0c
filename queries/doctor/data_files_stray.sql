-- Doctor check: every Parquet file under data/*/ is one of the dataset's data files (its name matches info.json's
-- data_path). Others (raw recorder output, a file of other columns copied in) are not read: frames would get rows
-- with NULL episode_index from them. They only mislead tools that read data/ whole.
--
-- returns: one row per stray file: path VARCHAR (relative to the dataset root). No rows means the check passed.
SELECT path
FROM _data_files_stray
ORDER BY path
