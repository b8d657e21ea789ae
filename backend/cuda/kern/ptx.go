package kern

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// ParsePTX lists the .entry points of PTX text with the byte size of each
// parameter (a .b8 name[N] array, as structs are passed, is N bytes times
// its element size).
func ParsePTX(ptx []byte) ([]Kernel, error) {
	var ks []Kernel
	var cur *Kernel
	sc := bufio.NewScanner(bytes.NewReader(ptx))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		t := strings.TrimSpace(sc.Text())
		switch {
		case cur == nil && strings.Contains(t, ".entry "):
			f := strings.Fields(t[strings.Index(t, ".entry ")+len(".entry "):])
			if len(f) == 0 {
				return nil, fmt.Errorf("kern: ptx line %d: .entry without a name", line)
			}
			name, _, _ := strings.Cut(f[0], "(")
			if name == "" {
				return nil, fmt.Errorf("kern: ptx line %d: .entry without a name", line)
			}
			ks = append(ks, Kernel{Name: name, Params: []int{}})
			cur = &ks[len(ks)-1]
			if strings.HasSuffix(t, "()") {
				cur = nil
			}
		case cur != nil && strings.HasPrefix(t, ".param"):
			n, err := paramSize(t)
			if err != nil {
				return nil, fmt.Errorf("kern: ptx line %d: %w", line, err)
			}
			cur.Params = append(cur.Params, n)
		case cur != nil && strings.HasPrefix(t, ")"):
			cur = nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("kern: ptx: %w", err)
	}
	if cur != nil {
		return nil, fmt.Errorf("kern: ptx: parameter list of %s not closed", cur.Name)
	}
	return ks, nil
}

// paramSize reads one ".param [.align N] .type name[[count]]" line.
func paramSize(t string) (int, error) {
	size := 0
	for _, f := range strings.Fields(strings.TrimSuffix(t, ",")) {
		if len(f) < 3 || f[0] != '.' {
			continue
		}
		switch f[1] {
		case 'u', 's', 'b', 'f':
			if n, err := strconv.Atoi(f[2:]); err == nil && (n == 8 || n == 16 || n == 32 || n == 64) {
				size = n / 8
			}
		}
	}
	if size == 0 {
		return 0, fmt.Errorf("parameter without a type: %q", t)
	}
	if i := strings.LastIndexByte(t, '['); i >= 0 {
		j := strings.IndexByte(t[i:], ']')
		if j < 0 {
			return 0, fmt.Errorf("unclosed array in %q", t)
		}
		n, err := strconv.Atoi(t[i+1 : i+j])
		if err != nil || n <= 0 || n > 1<<20 {
			return 0, fmt.Errorf("bad array length in %q", t)
		}
		size *= n
	}
	return size, nil
}
