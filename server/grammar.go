package server

// A byte-level pushdown recognizer for JSON and for the subset of JSON
// Schema that response_format json_schema and forced tool calls need. The
// constrained decoder (constraint.go) feeds it each candidate token's bytes
// from the current state and masks the tokens it rejects, so the output is
// valid by construction.

type gkind uint8

const (
	kAny       gkind = iota // any JSON value (resolved on its first byte)
	kObject                 // fixed properties, in order, all present
	kObjectAny              // any keys, values of node items
	kArray                  // items of node items, minItems..maxItems
	kString                 // minLen..maxLen characters (0: unbounded)
	kNumber                 // a JSON number
	kInteger                // a JSON integer
	kLiteral                // one of lits, byte for byte
	kSeq                    // seq[0], seq[1], ... in turn
)

// gnode is a grammar node; a compiled grammar is a tree of them.
type gnode struct {
	kind     gkind
	props    []gprop
	items    *gnode
	minItems int
	maxItems int // -1: unbounded
	minLen   int
	maxLen   int
	lits     [][]byte
	seq      []*gnode
}

type gprop struct {
	key  *gnode // a literal: the key with its quotes
	node *gnode
}

// Generic nodes of kAny once its first byte is seen.
var (
	anyNode       = &gnode{kind: kAny}
	anyObjectNode = &gnode{kind: kObjectAny, items: anyNode}
	anyArrayNode  = &gnode{kind: kArray, items: anyNode, maxItems: -1}
	anyStringNode = &gnode{kind: kString}
	numberNode    = &gnode{kind: kNumber}
	wordNode      = &gnode{kind: kLiteral, lits: [][]byte{[]byte("true"), []byte("false"), []byte("null")}}
)

const (
	maxDepth  = 48 // nesting deeper than this is refused
	maxWS     = 2  // consecutive whitespace bytes allowed between tokens
	maxDigits = 16 // digits in one number
)

// frame is one level of the parse: a node and where in it we are.
type frame struct {
	n   *gnode
	st  uint8
	ws  uint8
	i   int32  // property index, item count, characters, literal position, seq index, digits
	aux uint64 // literal alive set; UTF-8 continuation bytes or \u digits still due
}

type stackNode struct {
	f    frame
	next *stackNode
}

// gstate is a parse position. It is a small value: copying it forks the
// parse (the stack below the top frame is shared and never mutated).
type gstate struct {
	top   frame
	rest  *stackNode
	depth int
	done  bool
}

func newGState(root *gnode) gstate { return gstate{top: frame{n: root}, depth: 1} }

// accepting reports whether the input so far is a complete value.
func (s *gstate) accepting() bool {
	if s.done {
		return true
	}
	// A number at the top level ends where the input ends.
	if s.depth == 1 && (s.top.n.kind == kNumber || s.top.n.kind == kInteger) {
		return numberEndable(s.top.st)
	}
	return false
}

func (s *gstate) push(n *gnode) bool {
	if s.depth >= maxDepth {
		return false
	}
	s.rest = &stackNode{f: s.top, next: s.rest}
	s.top = frame{n: n}
	s.depth++
	return true
}

// pop ends the top frame and tells its parent, cascading through parents
// that end with it (a sequence whose last part ended).
func (s *gstate) pop() {
	for {
		if s.rest == nil {
			s.done, s.depth, s.top = true, 0, frame{}
			return
		}
		s.top, s.rest = s.rest.f, s.rest.next
		s.depth--
		if !s.childDone() {
			return
		}
	}
}

// childDone moves the top frame past its finished child; true when the
// top frame itself is finished by it.
func (s *gstate) childDone() bool {
	f := &s.top
	f.ws = 0
	switch f.n.kind {
	case kObject:
		switch f.st {
		case 1: // key
			f.st = 2
		case 3: // value
			f.st = 4
		}
	case kObjectAny:
		switch f.st {
		case 2: // key
			f.st = 3
		case 4: // value
			f.st = 5
		}
	case kArray:
		f.i++
		f.st = 2
	case kSeq:
		f.i++
		return int(f.i) == len(f.n.seq)
	}
	return false
}

type stepResult uint8

const (
	rReject stepResult = iota
	rOK                // byte consumed
	rOKDone            // byte consumed and the frame is finished
	rRefeed            // the frame finished before this byte; give it to the parent
	rPushed            // a child frame was pushed; feed it the byte
)

// feed advances over one byte; false (with s unusable) when the byte cannot
// come next.
func (s *gstate) feed(b byte) bool {
	for {
		if s.done {
			return false
		}
		switch s.step(b) {
		case rReject:
			return false
		case rOK:
			return true
		case rOKDone:
			s.pop()
			return true
		case rRefeed:
			s.pop()
		case rPushed:
		}
	}
}

func isWS(b byte) bool { return b == ' ' || b == '\n' || b == '\t' || b == '\r' }

// ws consumes whitespace between tokens, at most maxWS in a row.
func (f *frame) space(b byte) stepResult {
	if f.ws >= maxWS {
		return rReject
	}
	f.ws++
	return rOK
}

// value starts child n on byte b (after optional whitespace).
func (s *gstate) value(n *gnode, b byte, next uint8) stepResult {
	if isWS(b) {
		return s.top.space(b)
	}
	s.top.st = next
	if !s.push(n) {
		return rReject
	}
	return rPushed
}

func (s *gstate) step(b byte) stepResult {
	f := &s.top
	n := f.n
	switch n.kind {
	case kAny:
		switch {
		case b == '{':
			f.n = anyObjectNode
		case b == '[':
			f.n = anyArrayNode
		case b == '"':
			f.n = anyStringNode
		case b == '-' || (b >= '0' && b <= '9'):
			f.n = numberNode
		case b == 't' || b == 'f' || b == 'n':
			f.n = wordNode
		default:
			return rReject
		}
		return s.step(b)

	case kSeq:
		if int(f.i) >= len(n.seq) {
			return rReject
		}
		if !s.push(n.seq[f.i]) {
			return rReject
		}
		return rPushed

	case kLiteral:
		if f.i == 0 {
			f.aux = 1<<uint(min(len(n.lits), 64)) - 1
			if len(n.lits) >= 64 {
				f.aux = ^uint64(0)
			}
		}
		alive, doneAny := uint64(0), false
		for k, lit := range n.lits {
			if k >= 64 {
				break
			}
			if f.aux&(1<<uint(k)) != 0 && int(f.i) < len(lit) && lit[f.i] == b {
				alive |= 1 << uint(k)
				if int(f.i)+1 == len(lit) {
					doneAny = true
				}
			}
		}
		if alive == 0 {
			return rReject
		}
		f.aux = alive
		f.i++
		if doneAny {
			return rOKDone
		}
		return rOK

	case kString:
		return f.stringStep(b)

	case kNumber, kInteger:
		return f.numberStep(b, n.kind == kInteger)

	case kObject:
		switch f.st {
		case 0:
			if b != '{' {
				return rReject
			}
			if len(n.props) == 0 {
				f.st = 5
			} else {
				f.st = 1
				f.i = 0
				f.aux = 1 // the key is due
			}
			return rOK
		case 1: // key of property i
			if isWS(b) {
				return f.space(b)
			}
			if !s.push(n.props[f.i].key) {
				return rReject
			}
			return rPushed
		case 2: // ':'
			if isWS(b) {
				return f.space(b)
			}
			if b != ':' {
				return rReject
			}
			f.st, f.ws = 6, 0
			return rOK
		case 6: // value of property i
			return s.value(n.props[f.i].node, b, 3)
		case 4: // ',' or '}'
			if isWS(b) {
				return f.space(b)
			}
			last := int(f.i) == len(n.props)-1
			if b == ',' && !last {
				f.i++
				f.st, f.ws = 1, 0
				return rOK
			}
			if b == '}' && last {
				return rOKDone
			}
			return rReject
		case 5: // '}' of an empty object
			if isWS(b) {
				return f.space(b)
			}
			if b == '}' {
				return rOKDone
			}
			return rReject
		}
		return rReject

	case kObjectAny:
		switch f.st {
		case 0:
			if b != '{' {
				return rReject
			}
			f.st, f.ws = 1, 0
			return rOK
		case 1, 6: // first key or '}' (1); a key after ',' (6)
			if isWS(b) {
				return f.space(b)
			}
			if b == '}' && f.st == 1 {
				return rOKDone
			}
			if b != '"' {
				return rReject
			}
			f.st = 2
			if !s.push(anyStringNode) {
				return rReject
			}
			return rPushed
		case 3: // ':'
			if isWS(b) {
				return f.space(b)
			}
			if b != ':' {
				return rReject
			}
			f.st, f.ws = 7, 0
			return rOK
		case 7:
			return s.value(n.items, b, 4)
		case 5: // ',' or '}'
			if isWS(b) {
				return f.space(b)
			}
			switch b {
			case ',':
				f.st, f.ws = 6, 0
				return rOK
			case '}':
				return rOKDone
			}
			return rReject
		}
		return rReject

	case kArray:
		switch f.st {
		case 0:
			if b != '[' {
				return rReject
			}
			f.st, f.ws = 1, 0
			return rOK
		case 1: // first item or ']'
			if isWS(b) {
				return f.space(b)
			}
			if b == ']' {
				if n.minItems > 0 {
					return rReject
				}
				return rOKDone
			}
			if n.maxItems == 0 {
				return rReject
			}
			return s.value(n.items, b, 1)
		case 2: // ',' or ']'
			if isWS(b) {
				return f.space(b)
			}
			if b == ']' && int(f.i) >= n.minItems {
				return rOKDone
			}
			if b == ',' && (n.maxItems < 0 || int(f.i) < n.maxItems) {
				f.st, f.ws = 3, 0
				return rOK
			}
			return rReject
		case 3:
			return s.value(n.items, b, 3)
		}
	}
	return rReject
}

// stringStep: st 0 before the opening quote, 1 inside, 2 after a
// backslash, 3 inside \uXXXX (aux digits due), 4 inside a multi-byte UTF-8
// character (aux continuation bytes due).
func (f *frame) stringStep(b byte) stepResult {
	n := f.n
	switch f.st {
	case 0:
		if b != '"' {
			return rReject
		}
		f.st = 1
		return rOK
	case 1:
		switch {
		case b == '"':
			if int(f.i) < n.minLen {
				return rReject
			}
			return rOKDone
		case n.maxLen > 0 && int(f.i) >= n.maxLen:
			return rReject
		case b == '\\':
			f.st = 2
		case b < 0x20:
			return rReject
		case b < 0x80:
		default:
			need, lo, hi := utf8Lead(b)
			if need == 0 {
				return rReject
			}
			f.st, f.aux = 4, uint64(need)|uint64(lo)<<8|uint64(hi)<<16
		}
		f.i++
		return rOK
	case 2:
		switch b {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			f.st = 1
			return rOK
		case 'u':
			f.st, f.aux = 3, 4
			return rOK
		}
		return rReject
	case 3:
		if !isHex(b) {
			return rReject
		}
		f.aux--
		if f.aux == 0 {
			f.st = 1
		}
		return rOK
	case 4:
		lo, hi := byte(f.aux>>8), byte(f.aux>>16)
		if b < lo || b > hi {
			return rReject
		}
		need := f.aux&0xff - 1
		f.aux = need | 0x80<<8 | 0xBF<<16
		if need == 0 {
			f.st = 1
		}
		return rOK
	}
	return rReject
}

// utf8Lead gives, for the first byte of a multi-byte UTF-8 character, the
// number of continuation bytes and the range of the next one (which rules
// out overlong forms, surrogates and code points past U+10FFFF); need is 0
// for a byte that cannot start a character.
func utf8Lead(b byte) (need int, lo, hi byte) {
	switch {
	case b >= 0xC2 && b <= 0xDF:
		return 1, 0x80, 0xBF
	case b == 0xE0:
		return 2, 0xA0, 0xBF
	case b == 0xED:
		return 2, 0x80, 0x9F
	case b >= 0xE1 && b <= 0xEF:
		return 2, 0x80, 0xBF
	case b == 0xF0:
		return 3, 0x90, 0xBF
	case b >= 0xF1 && b <= 0xF3:
		return 3, 0x80, 0xBF
	case b == 0xF4:
		return 3, 0x80, 0x8F
	}
	return 0, 0, 0
}

func isHex(b byte) bool {
	return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F')
}

// numberEndable: the states in which a number may end.
func numberEndable(st uint8) bool { return st == 2 || st == 3 || st == 5 || st == 8 }

// numberStep: 0 start, 1 after '-', 2 integer digits, 3 after a leading 0,
// 4 after '.', 5 fraction digits, 6 after 'e', 7 after the exponent sign,
// 8 exponent digits.
func (f *frame) numberStep(b byte, integer bool) stepResult {
	digit := b >= '0' && b <= '9'
	if digit {
		if f.i >= maxDigits {
			if numberEndable(f.st) {
				return rRefeed
			}
			return rReject
		}
	}
	next := uint8(255)
	switch f.st {
	case 0:
		switch {
		case b == '-':
			next = 1
		case b == '0':
			next = 3
		case digit:
			next = 2
		}
	case 1:
		switch {
		case b == '0':
			next = 3
		case digit:
			next = 2
		}
	case 2, 3:
		switch {
		case digit && f.st == 2:
			next = 2
		case b == '.' && !integer:
			next = 4
		case (b == 'e' || b == 'E') && !integer:
			next = 6
		}
	case 4, 5:
		switch {
		case digit:
			next = 5
		case (b == 'e' || b == 'E') && f.st == 5:
			next = 6
		}
	case 6:
		switch {
		case b == '+' || b == '-':
			next = 7
		case digit:
			next = 8
		}
	case 7, 8:
		if digit {
			next = 8
		}
	}
	if next == 255 {
		if numberEndable(f.st) {
			return rRefeed
		}
		return rReject
	}
	if digit {
		f.i++
	}
	f.st = next
	return rOK
}
