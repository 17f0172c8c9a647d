package dispatch_test

// The fuzz input codec: the first three bytes of an input are the
// configuration (fzConfig) — five with tenants on, whose bit is one that
// inputs written before tenants existed never set — the rest a sequence of
// operations (fzOp), each a kind byte and its arguments; a short input reads
// as zeros. fzEncode is the inverse, so that the seeds read as what they do.

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Seed builders.

func fzSubmitOp(key, prio int) fzOp { return fzOp{kind: fzSubmit, key: key, prio: prio} }
func fzPostOp(key, prio int) fzOp   { return fzOp{kind: fzPost, key: key, prio: prio} }
func fzFinishOp(result int) fzOp    { return fzOp{kind: fzFinish, result: result} }
func fzAdvanceOp(d time.Duration) fzOp {
	return fzOp{kind: fzAdvance, dur: d}
}

func fzWith(op fzOp, mods ...func(*fzOp)) fzOp {
	for _, f := range mods {
		f(&op)
	}
	return op
}

func fzDeadline(d time.Duration) func(*fzOp) {
	return func(op *fzOp) { op.hasDL, op.dl = true, d }
}
func fzGen(g uint64) func(*fzOp)  { return func(op *fzOp) { op.gen = g } }
func fzDrop() func(*fzOp)         { return func(op *fzOp) { op.drop = true } }
func fzIdem(k string) func(*fzOp) { return func(op *fzOp) { op.idem = k } }

// fzTenant makes a submission one of the tenant i (fzTenantNames).
func fzTenant(i int) func(*fzOp) { return func(op *fzOp) { op.tenant = i } }
func fzCtx(kind int, dl time.Duration) func(*fzOp) {
	return func(op *fzOp) { op.ctxKind, op.ctxDL = kind, dl }
}

// fzPad is n operations that do nothing (they end Close's context before
// any Close), so that a seed's next submission gets the value it needs: a
// submission's value is its op's index + 1.
func fzPad(n int) []fzOp {
	return slices.Repeat([]fzOp{{kind: fzCloseAbort}}, n)
}

// fzSeq strings together operations (fzOp) and runs of them ([]fzOp).
func fzSeq(parts ...any) []fzOp {
	var ops []fzOp
	for _, p := range parts {
		switch p := p.(type) {
		case fzOp:
			ops = append(ops, p)
		case []fzOp:
			ops = append(ops, p...)
		default:
			panic(fmt.Sprintf("fzSeq: %T", p))
		}
	}
	return ops
}

// fzEncode is the inverse of the decoder, for seeds.
func fzEncode(cfg fzConfig, ops ...fzOp) []byte {
	bit := func(b bool, n uint) byte {
		if b {
			return 1 << n
		}
		return 0
	}
	must := func(i int, what string) byte {
		if i < 0 {
			panic("fzEncode: no encoding for " + what)
		}
		return byte(i)
	}
	ai := must(fzAgingIndex(cfg.aging, cfg.band), "aging and band")
	a := byte(cfg.merge) | bit(cfg.honour, 2) | bit(cfg.noop, 3) | bit(cfg.before, 4) | bit(cfg.drainClose, 5) |
		(ai&3)<<6
	b := byte(cfg.capacity-1) | byte(cfg.maxWaiters)<<2 | bit(cfg.labels, 5) | bit(cfg.follow, 6)
	if cfg.capacity == 64 {
		b = 0x80 | byte(cfg.maxWaiters)<<2 | bit(cfg.labels, 5) | bit(cfg.follow, 6)
	}
	c := byte(cfg.maxAttempts-1) | bit(cfg.breaker, 2) | bit(cfg.brRefuse, 4) | (ai>>2)<<5 | bit(cfg.tenants, 7)
	if cfg.breaker {
		c |= byte(cfg.brFailures-1) << 3
	}
	out := []byte{a, b, c}
	if cfg.tenants {
		w := func(i int) byte {
			if cfg.weight[i] < 1 || cfg.weight[i] > 4 {
				panic("fzEncode: no encoding for weight")
			}
			return byte(cfg.weight[i] - 1)
		}
		for _, q := range cfg.quota {
			if q < 0 || q > 3 {
				panic("fzEncode: no encoding for quota")
			}
		}
		out = append(out, byte(cfg.quota[0])|byte(cfg.quota[1])<<2|byte(cfg.quota[2])<<4|w(0)<<6, w(1)|w(2)<<2)
	}
	for _, op := range ops {
		out = append(out, must(slices.Index(fzKindOf[:], op.kind), "kind"))
		switch op.kind {
		case fzSubmit, fzPost:
			dl := must(slices.Index(fzOffsets[:], op.dl), "deadline") | bit(op.hasDL, 3)
			if !op.hasDL {
				dl = 0
			}
			dl |= byte(op.tenant) << 4
			out = append(out,
				byte(op.key)|must(slices.Index(fzPrios[:], op.prio), "priority")<<2,
				byte(op.gen)|must(slices.Index([]string{"", "x", "y"}, op.idem), "idem")<<2|bit(op.drop, 7),
				dl)
			if op.kind == fzSubmit {
				c := [...]byte{0, 4, 6, 7}[op.ctxKind]
				if op.ctxKind == fzCtxDeadline {
					c |= must(slices.Index(fzOffsets[:], op.ctxDL), "ctx deadline") << 3
				}
				out = append(out, c)
			}
		case fzTicketCancel, fzCtxCancel:
			out = append(out, byte(op.idx))
		case fzCancelKey:
			out = append(out, byte(op.key))
		case fzAdvance:
			out = append(out, must(slices.Index(fzDurs[:], op.dur), "duration"))
		case fzFinish:
			out = append(out, must(slices.Index(fzResultOf[:], op.result), "result"))
		}
	}
	return out
}

type fzReader struct {
	b []byte
	i int
}

func (r *fzReader) more() bool { return r.i < len(r.b) }

func (r *fzReader) next() byte {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return r.b[r.i-1]
}

type fzConfig struct {
	// merge: 0 replace, 1 sum, 2 sum that refuses incoming multiples of 3,
	// 3 sum that refuses incoming multiples of 3 and skips (SkipIncoming)
	// incoming multiples of 4, see fzMerge.
	merge       int
	honour      bool
	noop        bool // values divisible by 5 are no-ops
	before      bool // Config.BeforeRetry
	drainClose  bool // the final Close drains (else its context ends at once)
	aging       time.Duration
	band        int // Config.AgingBand
	capacity    int
	maxWaiters  int // 0: default
	maxAttempts int
	breaker     bool // Config.Breaker: consecutive-failure rule only, one probe
	brFailures  int  // BreakerPolicy.ConsecutiveFailures
	brRefuse    bool // BreakerPolicy.RefuseDroppable
	labels      bool // Config.Label: fzLabel of the submitted value
	follow      bool // Config.Follow: fzFollow
	// tenants configures the tenants of fzTenantNames, each with its
	// MaxQueued (quota, 0: none) and Weight (1 to 4); without it every
	// submission is of the tenant of no name, which has neither.
	tenants bool
	quota   [3]int
	weight  [3]int
}

// fzTenantNames are the tenants a submission can name, with tenants on.
var fzTenantNames = [3]string{"", "a", "b"}

func (c fzConfig) String() string {
	s := fmt.Sprintf("merge=%d honour=%v noop=%v before=%v drainClose=%v aging=%v band=%d capacity=%d maxWaiters=%d maxAttempts=%d labels=%v follow=%v",
		c.merge, c.honour, c.noop, c.before, c.drainClose, c.aging, c.band, c.capacity, c.maxWaiters, c.maxAttempts, c.labels, c.follow)
	if c.tenants {
		s += fmt.Sprintf(" tenants(maxQueued=%v weight=%v)", c.quota, c.weight)
	}
	if c.breaker {
		s += fmt.Sprintf(" breaker(failures=%d refuseDroppable=%v)", c.brFailures, c.brRefuse)
	}
	return s
}

// fzAgings are the aging intervals, 0 meaning strict priority. From 5s up,
// priority × aging overflows int64 for priorities Kubernetes uses
// (2 000 000 000 × 5s ≈ 1e19), and math.MaxInt64 makes the product of any
// large priority and the aging need all of 127 bits.
var fzAgings = [16]time.Duration{0, time.Millisecond, 3 * time.Millisecond, time.Second,
	5 * time.Second, 10 * time.Second, time.Hour, time.Nanosecond,
	2 * time.Second, 7 * time.Millisecond, 24 * time.Hour, time.Microsecond,
	5 * time.Second, 10 * time.Second, time.Hour, math.MaxInt64}

// fzBands are the priority band widths (Config.AgingBand) paired with
// fzAgings, index for index: 1 (strict priority) with aging 0, the
// default 10 with most, and narrow, wide and all-but-unbounded bands with
// the others.
var fzBands = [16]int{1, 10, 2, 10,
	10, 10, 10, 10,
	3, 10, 1 << 20, 1000,
	math.MaxInt, 5, 2, 10}

// fzAgingIndex is the index of an aging and band pair in fzAgings and
// fzBands, or −1. A zero band is the default's: 10, or 1 with aging 0.
func fzAgingIndex(aging time.Duration, band int) int {
	if band == 0 {
		band = 10
		if aging == 0 {
			band = 1
		}
	}
	for i := range fzAgings {
		if fzAgings[i] == aging && fzBands[i] == band {
			return i
		}
	}
	return -1
}

func fzDecodeConfig(r *fzReader) fzConfig {
	a, b, c := r.next(), r.next(), r.next()
	cfg := fzConfig{
		merge:       int(a & 3),
		honour:      a&0x04 != 0,
		noop:        a&0x08 != 0,
		before:      a&0x10 != 0,
		drainClose:  a&0x20 != 0,
		aging:       fzAgings[int(a>>6)|int(c>>5&3)<<2],
		band:        fzBands[int(a>>6)|int(c>>5&3)<<2],
		labels:      b&0x20 != 0,
		follow:      b&0x40 != 0,
		capacity:    1 + int(b%4),
		maxAttempts: 1 + int(c&3)%3,
		breaker:     c&0x04 != 0,
		brFailures:  1 + int(c>>3)&1,
		brRefuse:    c&0x10 != 0,
	}
	if b&0x80 != 0 {
		cfg.capacity = 64
	}
	if m := int(b>>2) & 7; m >= 1 && m <= 6 {
		cfg.maxWaiters = m
	}
	if c&0x80 != 0 {
		d, e := r.next(), r.next()
		cfg.tenants = true
		cfg.quota = [3]int{int(d & 3), int(d >> 2 & 3), int(d >> 4 & 3)}
		cfg.weight = [3]int{1 + int(d>>6&3), 1 + int(e&3), 1 + int(e>>2&3)}
	}
	return cfg
}

const (
	fzSubmit = iota
	fzPost
	fzTicketCancel
	fzCtxCancel
	fzCancelKey
	fzAdvance
	fzFinish
	fzClose
	fzCloseAbort
)

var fzKindOf = [32]int{
	fzSubmit, fzSubmit, fzSubmit, fzSubmit, fzSubmit, fzSubmit, fzSubmit, fzSubmit,
	fzPost, fzPost, fzPost, fzPost, fzPost,
	fzTicketCancel, fzTicketCancel, fzCtxCancel, fzCancelKey,
	fzAdvance, fzAdvance, fzAdvance, fzAdvance,
	fzFinish, fzFinish, fzFinish, fzFinish, fzFinish, fzFinish, fzFinish,
	fzClose, fzCloseAbort, fzSubmit, fzSubmit,
}

// How a released exec ends.
const (
	fzOK = iota
	fzPerm
	fzRetry
	fzPanic
	fzRecompute
)

var fzResultOf = [8]int{fzOK, fzOK, fzOK, fzPerm, fzRetry, fzRetry, fzPanic, fzRecompute}
var fzResultName = [...]string{"ok", "permanent", "retryable", "panic", "recompute"}

// Submit context kinds.
const (
	fzCtxBackground = iota
	fzCtxCancelable
	fzCtxDeadline
	fzCtxDone
)

// fzPrios are the priorities a submission can have. The first sixteen are
// small, so that aging lifts one over another within a test; the rest reach
// across the whole int range: the extremes, Kubernetes' priority classes
// (system-cluster-critical 2 000 000 000, system-node-critical
// 2 000 001 000), and pairs that straddle the point where priority × aging
// leaves int64 for one of the agings (⌊MaxInt64 / aging⌋ and one more), where
// a saturating order would make them tie.
var fzPrios = [64]int{
	0, 0, 0, 0, 1, 1, 2, 3, 5, -1, -3, 10, 1000, math.MaxInt, math.MinInt, math.MaxInt - 1,
	2000000000, 2000001000, 1000000000, -2000000000, 2000000000, 2000001000, 2000000001, 1999999999,
	math.MaxInt, math.MinInt, math.MaxInt - 1, math.MinInt + 1, math.MaxInt32, math.MinInt32, 1 << 40, -(1 << 40),
	1 << 62, -(1 << 62), math.MaxInt / 2, math.MinInt / 2,
	1844674407, 1844674408, -1844674407, -1844674408, // MaxInt64 / 5s
	922337203, 922337204, // MaxInt64 / 10s
	2562047, 2562048, // MaxInt64 / 1h
	9223372036, 9223372037, // MaxInt64 / 1s
	9223372036854, 9223372036855, -9223372036855, // MaxInt64 / 1ms
	0, 1, -1, 2, 3, -2, 4, 7, 100, -100, 1000000, -1000000, 2000000999, 3000000000, -3000000000,
}

var fzOffsets = [8]time.Duration{-time.Millisecond, 0, 500 * time.Microsecond, time.Millisecond,
	2 * time.Millisecond, 3 * time.Millisecond, 5 * time.Millisecond, 2 * time.Second}

var fzDurs = [8]time.Duration{500 * time.Microsecond, time.Millisecond, time.Millisecond, 2 * time.Millisecond,
	3 * time.Millisecond, 4 * time.Millisecond, 10 * time.Millisecond, 1500 * time.Millisecond}

type fzOp struct {
	kind    int
	key     int
	prio    int
	gen     uint64
	idem    string
	drop    bool
	hasDL   bool
	dl      time.Duration // offset from now
	ctxKind int
	ctxDL   time.Duration // offset from now
	tenant  int           // index in fzTenantNames; only with tenants on
	idx     int
	dur     time.Duration
	result  int
}

func fzDecodeOp(r *fzReader) fzOp {
	op := fzOp{kind: fzKindOf[r.next()%32]}
	switch op.kind {
	case fzSubmit, fzPost:
		k, g, dl := r.next(), r.next(), r.next()
		op.key = int(k % fzKeys)
		op.prio = fzPrios[k>>2]
		op.gen = uint64(g&3) % 3
		op.idem = [3]string{"", "x", "y"}[((g>>2)&3)%3]
		op.drop = g&0x80 != 0
		op.hasDL = dl&8 != 0
		op.dl = fzOffsets[dl&7]
		op.tenant = int(dl>>4&3) % 3
		if op.kind == fzSubmit {
			c := r.next()
			op.ctxKind = [8]int{0, 0, 0, 0, fzCtxCancelable, fzCtxCancelable, fzCtxDeadline, fzCtxDone}[c%8]
			op.ctxDL = fzOffsets[(c>>3)&7]
		}
	case fzTicketCancel, fzCtxCancel:
		op.idx = int(r.next())
	case fzCancelKey:
		op.key = int(r.next() % fzKeys)
	case fzAdvance:
		op.dur = fzDurs[r.next()%8]
	case fzFinish:
		op.result = fzResultOf[r.next()%8]
	}
	return op
}

func (op fzOp) String() string {
	switch op.kind {
	case fzSubmit, fzPost:
		name := "Submit"
		if op.kind == fzPost {
			name = "Post"
		}
		s := fmt.Sprintf("%s(k%d prio=%d gen=%d", name, op.key, op.prio, op.gen)
		if op.idem != "" {
			s += " idem=" + op.idem
		}
		if op.drop {
			s += " droppable"
		}
		if op.tenant != 0 {
			s += " tenant=" + fzTenantNames[op.tenant]
		}
		if op.hasDL {
			s += fmt.Sprintf(" deadline=now%+v", op.dl)
		}
		if op.kind == fzSubmit {
			s += " ctx=" + [...]string{"background", "cancelable", "deadline", "done"}[op.ctxKind]
			if op.ctxKind == fzCtxDeadline {
				s += fmt.Sprintf("(now%+v)", op.ctxDL)
			}
		}
		return s + ")"
	case fzTicketCancel:
		return fmt.Sprintf("Ticket.Cancel(#%d)", op.idx)
	case fzCtxCancel:
		return fmt.Sprintf("cancel ctx of ticket #%d", op.idx)
	case fzCancelKey:
		return fmt.Sprintf("Cancel(k%d)", op.key)
	case fzAdvance:
		return fmt.Sprintf("advance %v", op.dur)
	case fzFinish:
		return "finish running exec: " + fzResultName[op.result]
	case fzClose:
		return "Close (in background)"
	case fzCloseAbort:
		return "end Close's context"
	}
	return "?"
}
