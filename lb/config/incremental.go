// SPDX-License-Identifier: Apache-2.0

package config

import (
	"bytes"
	"reflect"
	"slices"

	"github.com/l4lb/l4lb/lb"
)

// Parser parses successive versions of one configuration file. A large
// file is mostly [[service]] blocks, and a reload changes few of them: the
// Parser keeps what each valid block validated to, keyed by the block's
// text, and decodes only the blocks whose text it has not seen, so a reload
// that changes one backend of 10,000 services costs a scan of the file and
// one block's parse, not a parse of the whole file. A file with as many
// blocks as the last valid one is compared with it position by position:
// the rules across services are checked for the changed blocks alone, and
// Stats names the services that changed, so that the merger looks at those
// alone too.
//
// Its results are Parse's, to the byte: whatever it cannot prove it handles
// the same way goes through Parse whole. That is a file it cannot cut into
// blocks safely (a multi-line string, a table other than a service's after
// the first [[service]], a header spelled another way), and any file with an
// error or a warning in a block or across blocks, so that every error keeps
// its file:line and its order. A Parser is not safe for concurrent use.
type Parser struct {
	// blocks are by text; a block validated under other defaults or
	// for another file name is decoded again.
	blocks map[string]*parsedBlock
	last   ParseStats
	// prev is the last valid result, what ParseStats.Changed is
	// relative to. It keeps that Config alive until the next Parse: the
	// daemon holds it anyway while it serves it.
	prev *Config
	// The last valid result parsed block by block, by position in the
	// file (nil after a whole parse): its blocks, and where each name,
	// frontend and VIP is. A reload that changes services in place
	// compares blocks by position, without hashing the file's text, and
	// checks the rules across services for the changed ones alone.
	order  []*parsedBlock
	names  map[string]int
	fronts map[lb.Frontend]int
	vips   VIPIndex
}

// ParseStats says how the last Parse of a Parser went.
type ParseStats struct {
	// Blocks are the [[service]] blocks of the file; Decoded those whose
	// text was new and had to be decoded.
	Blocks, Decoded int
	// Whole is set when the file went through Parse whole, and Why says
	// why (a file that is invalid, or that cannot be cut into blocks).
	Whole bool
	Why   string
	// Since, when not nil, is the Parser's previous valid result, and
	// Changed names the services of this result whose definition may
	// differ from the service at the same position of Since; all the
	// others are equal to Since's, in the same positions. What a source
	// needs for discovery.Snapshot.Changed. Since is nil (compare every
	// service) after a whole parse, when the number of services changed,
	// or without a previous result.
	Since   *Config
	Changed []string
}

// parsedBlock is a block that validated without an error or a warning,
// with everything else its validation depends on: the service defaults of
// the file's head and the file's name (the services' Source).
type parsedBlock struct {
	text     string
	defaults lb.Defaults
	name     string
	svc      lb.Service
	facts    serviceFacts
}

// NewParser returns a Parser with nothing cached.
func NewParser() *Parser { return &Parser{blocks: map[string]*parsedBlock{}} }

// Stats returns how the last Parse went.
func (p *Parser) Stats() ParseStats { return p.last }

// Load reads and parses the config file at path, as Load does.
func (p *Parser) Load(path string, opts Options) (*Config, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	return p.Parse(path, data, opts)
}

// Parse parses and validates a config file's contents, as Parse does.
func (p *Parser) Parse(name string, data []byte, opts Options) (*Config, error) {
	cfg, st, ok := p.parseBlocks(name, data, opts)
	if !ok {
		// The cache keeps the blocks of the last file that parsed
		// block by block: an invalid edit that is then undone costs
		// nothing more than this whole parse.
		p.last = ParseStats{Blocks: st.Blocks, Decoded: st.Blocks, Whole: true, Why: st.Why}
		cfg, err := Parse(name, data, opts)
		if err == nil {
			// No blocks by position to compare the next file's with.
			p.prev, p.order, p.names, p.fronts, p.vips = cfg, nil, nil, nil, VIPIndex{}
		}
		return cfg, err
	}
	p.last, p.prev = st, cfg
	return cfg, nil
}

// parseBlocks is the block-by-block parse; ok is false when the file must
// go through Parse whole (st.Why says why).
func (p *Parser) parseBlocks(name string, data []byte, opts Options) (cfg *Config, st ParseStats, ok bool) {
	head, blocks, why := splitServices(data)
	st.Blocks = len(blocks)
	if why != "" {
		st.Why = why
		return nil, st, false
	}
	// The head holds every setting but the services, at the lines it has
	// in the file: parsed alone, it validates as the file's head does.
	c := &checker{file: name}
	var raw rawFile
	strict, decoded := c.decodeTOML(head, &raw)
	if !decoded || len(raw.Service) > 0 || !c.version(raw.Version) {
		st.Why = "the settings before the first [[service]] do not parse on their own"
		return nil, st, false
	}
	c.addStrict(strict, nil, reflect.TypeOf(raw), true)
	cfg = c.config(&raw, opts)
	if len(c.errs) > 0 {
		st.Why = "the settings have errors"
		return nil, st, false
	}
	defs := cfg.Defaults()
	order := make([]*parsedBlock, len(blocks))
	services := make([]lb.Service, len(blocks))
	// changed are the positions whose block is not the previous
	// result's, when the file has as many blocks as that result.
	var changed []int
	inPlace := p.order != nil && len(p.order) == len(blocks)
	for i, b := range blocks {
		var pb *parsedBlock
		same := inPlace && p.order[i].text == string(b) // compared, not copied
		if same {
			pb = p.order[i]
		} else {
			pb = p.blocks[string(b)] // no copy of b for the look-up
		}
		if pb == nil || pb.defaults != defs || pb.name != name {
			if pb = parseBlock(name, b, defs); pb == nil {
				st.Why = "a service has an error or a warning"
				return nil, st, false
			}
			st.Decoded++
			same = false
		}
		if inPlace && !same {
			changed = append(changed, i)
		}
		if !pb.facts.nameOK || !pb.facts.frontendOK {
			st.Why = "a service's name or frontend is not one the rules across services can compare"
			return nil, st, false
		}
		order[i] = pb
	}
	// Every service's backends are copied into one array: configs share
	// no memory, and one allocation instead of one per service leaves the
	// collector fewer objects.
	total := 0
	for _, pb := range order {
		total += len(pb.svc.Backends)
	}
	arena := make([]lb.Backend, 0, total)
	for i, pb := range order {
		services[i] = pb.svc
		if pb.svc.Backends != nil {
			at := len(arena)
			arena = append(arena, pb.svc.Backends...)
			services[i].Backends = arena[at:len(arena):len(arena)]
		}
		services[i].SourceRanges = slices.Clone(pb.svc.SourceRanges)
	}
	if len(services) == 0 { // as Parse: no services is nil
		services = nil
	}
	cfg.Services = services
	c.capacity(cfg)
	if opts.Host != nil {
		for _, svc := range services {
			if format, _ := vipHostProblem(svc.Frontend, opts.Host); format != "" {
				st.Why = "a VIP is an address of this box"
				return nil, st, false
			}
			for _, b := range svc.Backends {
				if _, ok := boxAddress(b.Addr.Addr(), opts.Host.Addresses); ok {
					st.Why = "a backend is an address of this box"
					return nil, st, false
				}
			}
		}
	}
	// across is nil when the indexes of the previous result, updated
	// for the changed positions, hold for this one.
	var across *acrossIndex
	if inPlace {
		across, why = p.acrossChanged(order, changed)
	} else {
		across, why = acrossAll(order)
	}
	if why != "" {
		st.Why = why
		return nil, st, false
	}
	// raw (the head) has no services, so hostAddresses checks none: the
	// loop above did. The other host checks need only the head.
	c.host(&raw, cfg, opts.Host)
	if len(c.errs) > 0 {
		st.Why = "the file has errors"
		return nil, st, false
	}
	c.warns.sortByLine()
	cfg.Warnings = c.warns
	if inPlace {
		st.Since, st.Changed = p.prev, make([]string, 0, len(changed))
		for _, i := range changed {
			if order[i] != p.order[i] {
				st.Changed = append(st.Changed, order[i].svc.Name)
			}
		}
		// Valid blocks are unique (each has a name of its own): the
		// changed positions' old blocks go, their new ones come.
		for _, i := range changed {
			delete(p.blocks, p.order[i].text)
		}
		for _, i := range changed {
			p.blocks[order[i].text] = order[i]
		}
	} else {
		p.blocks = make(map[string]*parsedBlock, len(order))
		for _, pb := range order {
			p.blocks[pb.text] = pb
		}
	}
	if across == nil {
		p.reindex(order, changed)
	} else {
		p.names, p.fronts, p.vips = across.names, across.fronts, across.vips
	}
	p.order = order
	return cfg, st, true
}

// acrossIndex is where each name, frontend and VIP of a valid result's
// services is, by position.
type acrossIndex struct {
	names  map[string]int
	fronts map[lb.Frontend]int
	vips   VIPIndex
}

// acrossAll checks the rules across services that Parse checks (a name or
// a frontend used twice, a backend at another service's VIP) on every
// block, and indexes them. why is not empty when a rule is broken: Parse
// then reports it with its lines.
func acrossAll(order []*parsedBlock) (x *acrossIndex, why string) {
	x = &acrossIndex{}
	x.names = make(map[string]int, len(order))
	x.fronts = make(map[lb.Frontend]int, len(order))
	svcs := make([]lb.Service, len(order))
	for i, pb := range order {
		// Parse reports a clash at its second service, with the line
		// of the first.
		if _, dup := x.names[pb.svc.Name]; dup {
			return x, "two services share a name"
		}
		x.names[pb.svc.Name] = i
		if _, dup := x.fronts[pb.svc.Frontend]; dup {
			return x, "two services share a frontend"
		}
		x.fronts[pb.svc.Frontend] = i
		svcs[i] = pb.svc
	}
	x.vips = IndexVIPs(svcs)
	if len(AcrossServices(svcs, x.vips, func(int) string { return "" })) > 0 {
		return x, "a backend is another service's VIP"
	}
	return x, ""
}

// acrossChanged is acrossAll for a file with the previous result's number
// of blocks, where only the blocks at the changed positions (ascending)
// differ: the others passed the rules among themselves before, so only a
// pair with a changed block can break one now. x is nil when the Parser's
// indexes, once reindex has moved the changed positions, hold for order;
// it changes nothing itself, so that a file rejected later in the parse
// leaves them as the previous result's.
func (p *Parser) acrossChanged(order []*parsedBlock, changed []int) (x *acrossIndex, why string) {
	// A VIP that moved to, from or between the changed services can meet
	// a backend of any service; and with many changes (new service
	// defaults) checking all is cheaper than checking each change:
	// acrossAll does both.
	if len(changed) > len(order)/8 {
		return acrossAll(order)
	}
	for _, i := range changed {
		if order[i].svc.Frontend.Addr != p.order[i].svc.Frontend.Addr {
			return acrossAll(order)
		}
	}
	isChanged := func(i int) bool { _, found := slices.BinarySearch(changed, i); return found }
	for k, i := range changed {
		svc := order[i].svc
		// Taken by an unchanged service, or by another changed one.
		if j, ok := p.names[svc.Name]; ok && j != i && !isChanged(j) {
			return nil, "two services share a name"
		}
		if j, ok := p.fronts[svc.Frontend]; ok && j != i && !isChanged(j) {
			return nil, "two services share a frontend"
		}
		for _, other := range changed[:k] {
			if order[other].svc.Name == svc.Name {
				return nil, "two services share a name"
			}
			if order[other].svc.Frontend == svc.Frontend {
				return nil, "two services share a frontend"
			}
		}
		// Every service's VIP is where it was, so the VIP index holds:
		// only the changed services' backends are new.
		for _, b := range svc.Backends {
			if a := b.Addr.Addr(); a != svc.Frontend.Addr && p.vips.Has(a) {
				return nil, "a backend is another service's VIP"
			}
		}
	}
	return nil, ""
}

// reindex moves the names and frontends of the changed positions from the
// previous result's blocks to order's.
func (p *Parser) reindex(order []*parsedBlock, changed []int) {
	// The old ones go before the new ones come, so that two services
	// that swapped keep both.
	for _, i := range changed {
		old := p.order[i].svc
		if p.names[old.Name] == i {
			delete(p.names, old.Name)
		}
		if p.fronts[old.Frontend] == i {
			delete(p.fronts, old.Frontend)
		}
	}
	for _, i := range changed {
		p.names[order[i].svc.Name] = i
		p.fronts[order[i].svc.Frontend] = i
	}
}

// parseBlock validates one [[service]] block on its own; nil when it has
// an error or a warning (Parse then reports it at its line in the file).
func parseBlock(name string, text []byte, defs lb.Defaults) *parsedBlock {
	c := &checker{file: name}
	var raw rawFile
	strict, ok := c.decodeTOML(text, &raw)
	if !ok || strict != nil || len(raw.Service) != 1 || len(c.errs) > 0 {
		return nil
	}
	s := scope{c: c, path: indexPath("service", 0), service: serviceLabel(&raw.Service[0], 0)}
	svc, facts := c.service(s, &raw.Service[0], 0, defs)
	if len(c.errs) > 0 || len(c.warns) > 0 {
		return nil
	}
	svc.Source = "file:" + name
	return &parsedBlock{text: string(text), defaults: defs, name: name, svc: svc, facts: facts}
}

// splitServices cuts a file into its head, everything before the first
// [[service]] header, and one block per [[service]], from its header to
// the next one. why is not empty when the file cannot be cut safely: then
// a block might not mean alone what it means in the file.
func splitServices(data []byte) (head []byte, blocks [][]byte, why string) {
	if bytes.Contains(data, []byte(`"""`)) || bytes.Contains(data, []byte(`'''`)) {
		return nil, nil, "the file has a multi-line string"
	}
	start := -1 // of the current block; -1 in the head
	// Only lines that start with '[' matter: jump from one '[' to the
	// next, and look back for the start of its line.
	for i := 0; i < len(data); i++ {
		n := bytes.IndexByte(data[i:], '[')
		if n < 0 {
			break
		}
		i += n
		off := i // the start of the line, if only blanks precede the '['
		for off > 0 && (data[off-1] == ' ' || data[off-1] == '\t') {
			off--
		}
		if off > 0 && data[off-1] != '\n' {
			continue // inside a line: a value or a comment
		}
		line := data[i:]
		if eol := bytes.IndexByte(line, '\n'); eol >= 0 {
			line = line[:eol+1]
		}
		switch {
		case isServiceHeader(line):
			if start < 0 {
				head = data[:off]
			} else {
				blocks = append(blocks, data[start:off])
			}
			start = off
		case start < 0:
			// A header in the head that names services some
			// other way ([[ service ]], ["service"]) would
			// add to them unseen.
			if bytes.Contains(line, []byte("service")) {
				return nil, nil, "a header names services in another way than [[service]]"
			}
		case !bytes.HasPrefix(line, []byte("[[service.")) && !bytes.HasPrefix(line, []byte("[service.")):
			return nil, nil, "a table other than a service's follows the first [[service]]"
		}
		i += len(line) - 1
	}
	if start < 0 {
		return data, nil, ""
	}
	blocks = append(blocks, data[start:])
	return head, blocks, ""
}

// isServiceHeader reports whether line (left-trimmed) is exactly the
// [[service]] header, maybe followed by blanks and a comment.
func isServiceHeader(line []byte) bool {
	rest, ok := bytes.CutPrefix(line, []byte("[[service]]"))
	if !ok {
		return false
	}
	rest = bytes.TrimLeft(rest, " \t\r")
	return len(rest) == 0 || rest[0] == '\n' || rest[0] == '#'
}
