// Package units formats byte sizes and counts for people: "1.24 GB",
// "6.29 M", "512 B".
package units

import "fmt"

// Bytes formats n bytes with a decimal unit (B, kB, MB, GB, TB), three
// significant digits above 1 kB.
func Bytes(n int64) string { return scaled(n, "B", []string{"kB", "MB", "GB", "TB", "PB", "EB"}) }

// Count formats a count (parameters, tokens) with K, M, B (billions) or T,
// three significant digits above a thousand: 6_291_456 → "6.29 M".
func Count(n int64) string { return scaled(n, "", []string{"K", "M", "B", "T", "Q", "E"}) }

func scaled(n int64, base string, units []string) string {
	neg := ""
	v := float64(n)
	if n < 0 {
		neg, v = "-", -v
	}
	if v < 1000 {
		if base == "" {
			return fmt.Sprintf("%s%d", neg, int64(v))
		}
		return fmt.Sprintf("%s%d %s", neg, int64(v), base)
	}
	u := -1
	for v >= 999.5 && u+1 < len(units) {
		v /= 1000
		u++
	}
	prec := 2
	switch {
	case v >= 99.95:
		prec = 0
	case v >= 9.995:
		prec = 1
	}
	return fmt.Sprintf("%s%.*f %s", neg, prec, v, units[u])
}
