package units

import "testing"

func TestBytesAndCount(t *testing.T) {
	for _, c := range []struct {
		n          int64
		bytes, cnt string
	}{
		{0, "0 B", "0"},
		{999, "999 B", "999"},
		{1000, "1.00 kB", "1.00 K"},
		{1234, "1.23 kB", "1.23 K"},
		{99_949, "99.9 kB", "99.9 K"},
		{999_499, "999 kB", "999 K"},
		{999_500, "1.00 MB", "1.00 M"},
		{6_291_456, "6.29 MB", "6.29 M"},
		{1_235_814_400, "1.24 GB", "1.24 B"},
		{8_030_261_248, "8.03 GB", "8.03 B"},
		{-2048, "-2.05 kB", "-2.05 K"},
		{1 << 62, "4.61 EB", "4.61 E"},
	} {
		if got := Bytes(c.n); got != c.bytes {
			t.Errorf("Bytes(%d) = %q, want %q", c.n, got, c.bytes)
		}
		if got := Count(c.n); got != c.cnt {
			t.Errorf("Count(%d) = %q, want %q", c.n, got, c.cnt)
		}
	}
}
