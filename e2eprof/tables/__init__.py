"""The run directory's Parquet tables: their declared schemas, the writer that conforms to them, the reader."""
