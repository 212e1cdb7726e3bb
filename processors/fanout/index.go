package fanout

import (
	"carehub/kernel/events"
)

// index finds the subscriptions an event may concern without visiting the others. Subscriptions
// are grouped by project (those without one in a bucket of their own, which every event visits)
// and, inside a project, by event type when every one of their Types is an exact type; the rest
// of a project's subscriptions (no Types, or a prefix.* or * pattern among them) are visited by
// every event of the project and checked with events.MatchAny.
//
// A subscription may sit in several lists (one per exact type it wants). Lists are slices, for
// a fast route; each member remembers where its subscription keeps its position, so removal is a
// swap with the last member, in O(lists of the subscription).
//
// index is not safe for concurrent use; the Hub guards it with its mutex.
type index struct {
	global   bucket             // subscriptions without a project
	projects map[string]*bucket // by Filter.ProjectID
	count    int
}

type bucket struct {
	project string
	any     *list            // not indexed by type
	byType  map[string]*list // exact types
}

type list struct {
	bucket  *bucket
	typ     string // "" for bucket.any
	members []member
}

// member is a subscription in a list; ref is the index of the matching entry in its refs.
type member struct {
	s   *Subscription
	ref int
}

// ref is where a subscription sits: list l at position pos.
type ref struct {
	l   *list
	pos int
}

func newIndex() index {
	return index{global: bucket{byType: map[string]*list{}}, projects: map[string]*bucket{}}
}

// indexedTypes returns the types to index a filter's subscription under, or nil when it must be
// visited by every event of its project.
func indexedTypes(f Filter) []string {
	if f.Types == nil || len(f.Types) == 0 {
		return nil
	}
	for _, t := range f.Types {
		if !events.ValidType(t) { // a pattern (or garbage, which MatchAny never matches)
			return nil
		}
	}
	return f.Types
}

func (x *index) add(s *Subscription) {
	b := &x.global
	if p := s.filter.ProjectID; p != "" {
		if b = x.projects[p]; b == nil {
			b = &bucket{project: p, byType: map[string]*list{}}
			x.projects[p] = b
		}
	}
	types := indexedTypes(s.filter)
	if types == nil {
		if b.any == nil {
			b.any = &list{bucket: b}
		}
		b.any.add(s)
	}
	for _, t := range types {
		l := b.byType[t]
		if l == nil {
			l = &list{bucket: b, typ: t}
			b.byType[t] = l
		}
		if !l.has(s) { // Types may repeat a type
			l.add(s)
		}
	}
	x.count++
}

func (l *list) add(s *Subscription) {
	s.refs = append(s.refs, ref{l, len(l.members)})
	l.members = append(l.members, member{s, len(s.refs) - 1})
}

func (l *list) has(s *Subscription) bool {
	for _, r := range s.refs {
		if r.l == l {
			return true
		}
	}
	return false
}

func (x *index) remove(s *Subscription) {
	for _, r := range s.refs {
		l := r.l
		last := l.members[len(l.members)-1]
		l.members[r.pos] = last
		last.s.refs[last.ref].pos = r.pos
		l.members[len(l.members)-1] = member{}
		l.members = l.members[:len(l.members)-1]
		if len(l.members) > 0 {
			continue
		}
		b := l.bucket
		if l.typ == "" {
			b.any = nil
		} else {
			delete(b.byType, l.typ)
		}
		if b != &x.global && b.any == nil && len(b.byType) == 0 {
			delete(x.projects, b.project)
		}
	}
	s.refs = nil
	x.count--
}

// each calls fn for every subscription that selects ev, each once.
func (x *index) each(ev events.Event, fn func(*Subscription)) {
	x.global.each(ev, fn)
	if b := x.projects[ev.ProjectID]; b != nil {
		b.each(ev, fn)
	}
}

func (b *bucket) each(ev events.Event, fn func(*Subscription)) {
	if b.any != nil {
		for _, m := range b.any.members {
			f := m.s.filter
			if f.Types != nil && !events.MatchAny(f.Types, ev.Type) {
				continue
			}
			if f.Match != nil && !f.Match(ev) {
				continue
			}
			fn(m.s)
		}
	}
	if l := b.byType[ev.Type]; l != nil {
		for _, m := range l.members {
			if m.s.filter.Match != nil && !m.s.filter.Match(ev) {
				continue
			}
			fn(m.s)
		}
	}
}

// wants reports whether a subscription may select an event with head h: each would visit one,
// short of its Match, which needs the whole event.
func (x *index) wants(h events.Head) bool {
	if x.global.wants(h) {
		return true
	}
	b := x.projects[h.ProjectID]
	return b != nil && b.wants(h)
}

func (b *bucket) wants(h events.Head) bool {
	if l := b.byType[h.Type]; l != nil && len(l.members) > 0 {
		return true
	}
	if b.any != nil {
		for _, m := range b.any.members {
			if m.s.filter.Types == nil || events.MatchAny(m.s.filter.Types, h.Type) {
				return true
			}
		}
	}
	return false
}

// all returns every subscription.
func (x *index) all() []*Subscription {
	seen := make(map[*Subscription]bool, x.count)
	out := make([]*Subscription, 0, x.count)
	collect := func(b *bucket) {
		lists := make([]*list, 0, len(b.byType)+1)
		if b.any != nil {
			lists = append(lists, b.any)
		}
		for _, l := range b.byType {
			lists = append(lists, l)
		}
		for _, l := range lists {
			for _, m := range l.members {
				if !seen[m.s] {
					seen[m.s] = true
					out = append(out, m.s)
				}
			}
		}
	}
	collect(&x.global)
	for _, b := range x.projects {
		collect(b)
	}
	return out
}
