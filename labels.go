package dispatch

// liveCalls counts the calls not finished (ready, delayed, behind and
// running), and by tenant and label if Config.Label is set. The
// Dispatcher's lock guards it.
type liveCalls[K comparable, T any] struct {
	n    int
	tags map[tagKey[K, T]]*callTag[K, T] // nil without Config.Label
	// idle counts the tags in tags that no live call has. They are kept
	// for their next call, so that a dispatcher whose calls come one at a
	// time makes no callTag per call, and forgotten together once there
	// are more than maxIdleLabels of them and than live ones. An idle tag
	// of a tenant forgotten meanwhile (tenants.forgetIdle) is never found
	// again, and waits for that sweep.
	idle int
}

// maxIdleLabels is how many tags without a live call are always kept.
const maxIdleLabels = 64

// callTag is what a call is counted under: its tenant and its label,
// interned, so that a call holds one word for both (call.tag). Without
// Config.Label a call holds its tenant's own tag (tenant.tag), of the
// label "". With it, a tag counts its live calls (0 while kept idle),
// found without a lookup when a call ends.
type callTag[K comparable, T any] struct {
	ten   *tenant[K, T]
	label string
	n     int
}

// tagKey is what a tag is interned by.
type tagKey[K comparable, T any] struct {
	ten   *tenant[K, T]
	label string
}

// add counts a new call of tenant ten and label, and returns its tag.
func (lc *liveCalls[K, T]) add(ten *tenant[K, T], label string) *callTag[K, T] {
	lc.n++
	return lc.count(ten, label)
}

// remove uncounts a call of tag g that is gone.
func (lc *liveCalls[K, T]) remove(g *callTag[K, T]) {
	lc.n--
	lc.drop(g)
}

// retag moves a live call of tag from to tenant ten and label, and returns
// its tag now.
func (lc *liveCalls[K, T]) retag(from *callTag[K, T], ten *tenant[K, T], label string) *callTag[K, T] {
	if from.ten == ten && from.label == label {
		return from
	}
	lc.drop(from)
	return lc.count(ten, label)
}

func (lc *liveCalls[K, T]) count(ten *tenant[K, T], label string) *callTag[K, T] {
	if lc.tags == nil {
		return &ten.tag
	}
	g := ten.lastTag
	if g == nil || g.label != label {
		k := tagKey[K, T]{ten, label}
		if g = lc.tags[k]; g == nil {
			g = &callTag[K, T]{ten: ten, label: label}
			lc.tags[k] = g
			lc.idle++ // idle until counted, below
		}
		ten.lastTag = g
	}
	if g.n == 0 {
		lc.idle--
	}
	g.n++
	return g
}

func (lc *liveCalls[K, T]) drop(g *callTag[K, T]) {
	if lc.tags == nil {
		return
	}
	if g.n--; g.n > 0 {
		return
	}
	lc.idle++
	if lc.idle > maxIdleLabels && lc.idle > len(lc.tags)-lc.idle {
		for k, g := range lc.tags {
			if g.n == 0 {
				delete(lc.tags, k)
				if g.ten.lastTag == g {
					g.ten.lastTag = nil // not to be counted again outside tags
				}
			}
		}
		lc.idle = 0
	}
}

// counts returns the number of live calls of each label that has any,
// over every tenant.
func (lc *liveCalls[K, T]) counts() map[string]int {
	m := make(map[string]int, len(lc.tags)-lc.idle)
	for k, g := range lc.tags {
		if g.n > 0 {
			m[k.label] += g.n
		}
	}
	return m
}
