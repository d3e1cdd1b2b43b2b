-- dp_bin(x, width): the lower edge of x's bin of the given width, bins anchored at 0:
-- [k*width, (k+1)*width). In DP queries (GROUP BY dp_bin(col, width)) dpsql clamps x into
-- the column's declared bounds first and lists every bin of the bounds, empty ones included.
-- Usable as is on released tables, e.g. SELECT udfs.dp_bin(age, 10), count(*) ...
CREATE OR REPLACE MACRO udfs.dp_bin(x, width) AS width * floor(x / width);
