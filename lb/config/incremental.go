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
// one block's parse, not a parse of the whole file.
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
		return Parse(name, data, opts)
	}
	p.last = st
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
	next := make(map[string]*parsedBlock, len(blocks))
	names := make(map[string]struct{}, len(blocks))
	fronts := make(map[lb.Frontend]struct{}, len(blocks))
	services := make([]lb.Service, 0, len(blocks))
	for _, b := range blocks {
		pb := p.blocks[string(b)] // no copy of b for the look-up
		if pb == nil || pb.defaults != defs || pb.name != name {
			if pb = parseBlock(name, b, defs); pb == nil {
				st.Why = "a service has an error or a warning"
				return nil, st, false
			}
			st.Decoded++
		}
		next[pb.text] = pb
		// The rules across services: Parse reports a clash at its
		// second service, with the line of the first.
		if _, dup := names[pb.svc.Name]; dup || !pb.facts.nameOK {
			st.Why = "two services share a name"
			return nil, st, false
		}
		names[pb.svc.Name] = struct{}{}
		if _, dup := fronts[pb.svc.Frontend]; dup || !pb.facts.frontendOK {
			st.Why = "two services share a frontend"
			return nil, st, false
		}
		fronts[pb.svc.Frontend] = struct{}{}
		services = append(services, cloneService(pb.svc))
	}
	if len(services) > 0 { // as Parse: no services is nil
		cfg.Services = services
	}
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
	if len(AcrossServices(services, IndexVIPs(services), func(int) string { return "" })) > 0 {
		st.Why = "a backend is another service's VIP"
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
	p.blocks = next
	return cfg, st, true
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

// cloneService copies the slices of a cached service, keeping nil as nil,
// so that no two Configs share memory.
func cloneService(s lb.Service) lb.Service {
	s.Backends = slices.Clone(s.Backends)
	s.SourceRanges = slices.Clone(s.SourceRanges)
	return s
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
