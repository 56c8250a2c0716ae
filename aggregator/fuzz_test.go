package aggregator

import (
	"errors"
	"testing"

	"github.com/dragon-rag/dragon/codec"
)

// program reads a fuzz input as a stream of small choices; past its end
// every choice is 0.
type program struct{ b []byte }

func (p *program) next() byte {
	if len(p.b) == 0 {
		return 0
	}
	c := p.b[0]
	p.b = p.b[1:]
	return c
}

// near is base plus one of -1, 0, +1 or +2 (never below 0).
func (p *program) near(base uint64) uint64 {
	d := uint64(p.next() % 4)
	if base+d == 0 {
		return 0
	}
	return base + d - 1
}

// dist is a distribution over the test vocabulary with one or two tokens.
func (p *program) dist() []float32 {
	probs := make([]float32, vocab)
	probs[p.next()%vocab] += 1 + float32(p.next()%4)
	probs[p.next()%vocab] += float32(p.next() % 4)
	return probs
}

// FuzzNodeAgainstAPeer: whatever the peer sends (drafts, hedges, branch
// drafts, verdicts and handovers, with any steps, epochs, tokens,
// payloads and flags, in any order) a Node takes it or refuses it with
// ErrProtocol (the session then closes that stream); it never panics, and
// the steps it decides run 0, 1, 2, … with none skipped or decided twice,
// each of this side's rollbacks right after the step it follows. The
// peer's messages stay close to what the Node expects (steps and epochs
// within a few of its own), so that most are taken and the program goes
// deep; the local producer drafts as a session does, hedging when told.
func FuzzNodeAgainstAPeer(f *testing.F) {
	f.Add([]byte{0, 0, 2, 1, 5, 2, 1, 2, 1, 1, 0, 5, 3, 2, 1, 0, 0, 0, 2, 1, 6, 1, 1, 3, 1, 0, 0})
	f.Add([]byte{1, 1, 1, 2, 2, 5, 1, 1, 1, 0, 0, 5, 2, 3, 1, 3, 2, 0, 0, 1, 0, 2, 2, 1, 3, 4, 2, 1, 1})
	f.Add([]byte{2, 0, 6, 1, 3, 0, 1, 1, 2, 2, 1, 1, 0, 3, 1, 1, 1, 2, 2, 3, 5, 1, 0, 2, 4, 0, 1})
	f.Add([]byte{3, 3, 1, 4, 0, 1, 1, 3, 2, 2, 2, 1, 1, 1, 0, 1, 1, 1, 1, 2, 7, 1, 3, 3, 4, 2})
	f.Fuzz(func(t *testing.T, input []byte) {
		p := &program{b: input}
		head := p.next()
		self := Device
		agg := Side(1 + head%2)
		cfg := hedgeConfig(self, agg)
		cfg.Greedy = head&2 == 0
		n, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		peer := self.Other()
		dec, err := codec.NewDecoder(vocab)
		if err != nil {
			t.Fatal(err)
		}
		local, err := NewProposer(self, 1, cfg.Greedy, 1)
		if err != nil {
			t.Fatal(err)
		}
		remote, err := NewProposer(peer, 2, cfg.Greedy, 1)
		if err != nil {
			t.Fatal(err)
		}
		var localNext, peerNext, decided uint64
		for len(p.b) > 0 && !n.Done() {
			var ev Event
			switch p.next() % 5 {
			case 0: // the local producer's next draft, hedged when told
				d, err := local.Propose(p.dist(), localNext, n.Epoch(self), 0)
				if err != nil {
					t.Fatal(err)
				}
				if alt, ok := d.RunnerUp(); ok && p.next()%2 == 1 {
					if d, err = d.WithHedge(alt); err != nil {
						t.Fatal(err)
					}
				}
				localNext++
				ev = LocalDrafts{Drafts: []Draft{d}}
			case 1: // a peer's draft from the wire, any of its fields
				w := WireDraft{Side: peer, Step: p.near(peerNext), Epoch: n.Epoch(peer), LogMass: float64(int8(p.next())) / 16}
				if c := p.next(); c%4 == 0 { // any side and epoch
					w.Side, w.Epoch = Side(c/4%3), uint32(p.near(uint64(w.Epoch)))
				}
				// Mostly the token and payload a peer's proposer makes, and
				// its runner-up as the hedge; sometimes any token or bytes.
				drawn, err := remote.Propose(p.dist(), w.Step, w.Epoch, 0)
				if err != nil {
					t.Fatal(err)
				}
				w.Token, w.Payload = drawn.Token(), drawn.Payload()
				if c := p.next(); c%4 == 0 {
					w.Token = int32(c / 4 % vocab)
				}
				if p.next()%8 == 0 {
					k := int(p.next() % 16)
					w.Payload = append([]byte(nil), p.b[:min(len(p.b), k)]...)
				}
				switch c := p.next(); c % 4 {
				case 1: // hedged on the runner-up (-1 when there is none)
					alt, _ := drawn.RunnerUp()
					w.Hedged, w.Hedge = true, alt
				case 2: // hedged on any token
					w.Hedged, w.Hedge = true, int32(c/4%vocab)
				case 3: // on the branch forked at a recent step
					fork := peerNext - min(peerNext, uint64(1+c/4%4))
					w.Fork, w.Step = fork+1, fork+1+uint64(c/16%4)
				}
				d, err := DecodeDraft(dec, w)
				if err != nil {
					if !errors.Is(err, ErrProtocol) {
						t.Fatalf("DecodeDraft: %v, not a protocol error", err)
					}
					continue
				}
				if w.Fork == 0 && w.Step >= peerNext {
					peerNext = w.Step + 1
				}
				ev = RemoteDrafts{Drafts: []Draft{d}}
			case 2: // a verdict from the peer, any of its fields
				v := Verdict{Step: p.near(n.NextStep()), Target: int32(p.next() % vocab)}
				for i := range 2 {
					c := p.next()
					v.Accept[i], v.Hedged[i], v.Moved[i] = c&1 != 0, c&2 != 0, c&4 != 0
					side := Side(i + 1)
					v.Epoch[i] = uint32(p.near(uint64(n.Epoch(side))))
					v.NextEpoch[i] = uint32(p.near(uint64(v.Epoch[i]) + 1))
				}
				ev = RemoteVerdicts{Verdicts: []Verdict{v}}
			case 3: // a handover from the peer, with a queue of its drafts
				h := Handover{NextStep: p.near(n.NextStep())}
				for i := range 2 {
					h.Epochs[i] = uint32(p.near(uint64(n.Epoch(Side(i + 1)))))
				}
				for i := range int(p.next() % 3) {
					d, err := remote.Propose(p.dist(), h.NextStep+uint64(i), h.Epochs[peer.Index()], 0)
					if err != nil {
						t.Fatal(err)
					}
					h.Queue = append(h.Queue, d)
				}
				ev = RemoteHandover{Handover: h}
			default:
				if p.next()%8 == 0 {
					ev = Finish{}
				} else {
					ev = SwitchRequest{}
				}
			}
			acts, err := n.Step(ev)
			if err != nil {
				if !errors.Is(err, ErrProtocol) {
					t.Fatalf("%T: %v, not a protocol error", ev, err)
				}
				return
			}
			for _, a := range acts {
				switch a := a.(type) {
				case Decided:
					if a.Verdict.Step != decided {
						t.Fatalf("decided step %d, want step %d", a.Verdict.Step, decided)
					}
					decided++
					if !a.Verdict.Accepted(peer) {
						peerNext = a.Verdict.Step + 1
					}
				case Rollback:
					if a.Step+1 != decided {
						t.Fatalf("rollback to step %d after %d decided steps", a.Step, decided)
					}
					localNext = a.Step + 1
				}
			}
		}
	})
}
