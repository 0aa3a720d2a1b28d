"""FEED: pack images into shards and load them fast (local or S3, CPU or GPU preprocessing)."""
