package dispatch

// liveCalls counts the calls not finished (ready, delayed, behind and
// running), and by label if Config.Label is set. The Dispatcher's lock
// guards it.
type liveCalls struct {
	n      int
	labels map[string]*liveLabel // nil without Config.Label
	// idle counts the labels in labels that no live call has. They are
	// kept for their next call, so that a dispatcher whose calls come one
	// at a time makes no liveLabel per call, and forgotten together once
	// there are more than maxIdleLabels of them and than live ones.
	idle int
}

// maxIdleLabels is how many labels without a live call are always kept.
const maxIdleLabels = 64

// liveLabel is a label that live calls have, and how many (0 while it is
// kept idle). Each of them holds it (call.label): one word for the label,
// and its count found without a lookup when the call ends. Without
// Config.Label a call holds nil, the label "".
type liveLabel struct {
	name string
	n    int
}

// String returns the label l stands for.
func (l *liveLabel) String() string {
	if l == nil {
		return ""
	}
	return l.name
}

// add counts a new call of label and returns what the call holds.
func (lc *liveCalls) add(label string) *liveLabel {
	lc.n++
	return lc.count(label)
}

// remove uncounts a call of label l that is gone.
func (lc *liveCalls) remove(l *liveLabel) {
	lc.n--
	lc.drop(l)
}

// relabel moves a live call from label from to label to, and returns
// what the call now holds.
func (lc *liveCalls) relabel(from *liveLabel, to string) *liveLabel {
	if from == nil || from.name == to {
		return from
	}
	lc.drop(from)
	return lc.count(to)
}

func (lc *liveCalls) count(label string) *liveLabel {
	if lc.labels == nil {
		return nil
	}
	l := lc.labels[label]
	switch {
	case l == nil:
		l = &liveLabel{name: label}
		lc.labels[label] = l
	case l.n == 0:
		lc.idle--
	}
	l.n++
	return l
}

func (lc *liveCalls) drop(l *liveLabel) {
	if l == nil {
		return
	}
	if l.n--; l.n > 0 {
		return
	}
	lc.idle++
	if lc.idle > maxIdleLabels && lc.idle > len(lc.labels)-lc.idle {
		for name, l := range lc.labels {
			if l.n == 0 {
				delete(lc.labels, name)
			}
		}
		lc.idle = 0
	}
}

// counts returns the number of live calls of each label that has any.
func (lc *liveCalls) counts() map[string]int {
	m := make(map[string]int, len(lc.labels)-lc.idle)
	for name, l := range lc.labels {
		if l.n > 0 {
			m[name] = l.n
		}
	}
	return m
}
