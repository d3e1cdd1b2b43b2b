-- Range counts from a `range` release (a DP tree histogram): free post-processing.
-- The release is the table released.<name> with columns lo, hi[, lo2, hi2], count;
-- values are assumed spread uniformly inside each bin, so a range that cuts a bin
-- counts the overlapping fraction of it. Ranges are half-open: lo <= value < hi.
-- The release name is quoted as one identifier inside schema released.

-- dp_range_count(release, lo, hi): rows whose (first) column lies in [lo, hi).
CREATE OR REPLACE MACRO udfs.dp_range_count(release, range_lo, range_hi) AS (
    SELECT coalesce(sum("count" * greatest(0, least(hi, range_hi) - greatest(lo, range_lo))
                        / (hi - lo)), 0)
    FROM query_table('"' || replace(current_database(), '"', '""') || '"."released"."'
                     || replace(release, '"', '""') || '"')
);

-- dp_range_count2(release, lo, hi, lo2, hi2): rows in [lo, hi) x [lo2, hi2) of a two-column release.
CREATE OR REPLACE MACRO udfs.dp_range_count2(release, range_lo, range_hi, range_lo2, range_hi2) AS (
    SELECT coalesce(sum("count"
                        * greatest(0, least(hi, range_hi) - greatest(lo, range_lo)) / (hi - lo)
                        * greatest(0, least(hi2, range_hi2) - greatest(lo2, range_lo2))
                        / (hi2 - lo2)), 0)
    FROM query_table('"' || replace(current_database(), '"', '""') || '"."released"."'
                     || replace(release, '"', '""') || '"')
);
