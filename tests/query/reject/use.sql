-- switch schema
-- expect: USE
USE dpsql
