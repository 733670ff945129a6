// SPDX-License-Identifier: Apache-2.0

package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/pelletier/go-toml/v2/unstable"
)

// lineIndex maps key paths such as `service[1].backend[0].address` to the
// line where the key (or the table header, or the array element) appears.
// Decoders report positions only for their own errors; semantic checks run
// after decoding, so they find their line here.
type lineIndex struct {
	lines    map[string]int
	newlines []int // byte offsets of '\n', ascending
}

func newLineIndex(data []byte) *lineIndex {
	x := &lineIndex{lines: make(map[string]int)}
	for i, c := range data {
		if c == '\n' {
			x.newlines = append(x.newlines, i)
		}
	}
	return x
}

// lineAt converts a byte offset into a 1-based line number.
func (x *lineIndex) lineAt(offset int) int {
	return sort.SearchInts(x.newlines, offset) + 1
}

// add records the first place a path appears: for a table defined by dotted
// keys, the first key that mentions it is where a reader looks for it.
func (x *lineIndex) add(path string, line int) {
	if _, ok := x.lines[path]; !ok && path != "" {
		x.lines[path] = line
	}
}

// line returns the line of path, falling back to the enclosing table or
// array element when the key itself is absent (a missing required key is
// reported at its table's header). 0 means nothing in the document holds it.
func (x *lineIndex) line(path string) int {
	for path != "" {
		if l, ok := x.lines[path]; ok {
			return l
		}
		path = parentPath(path)
	}
	return 0
}

// parentPath drops the last `.key` or `[n]` of a path.
func parentPath(path string) string {
	i := strings.LastIndexAny(path, ".[")
	if i < 0 {
		return ""
	}
	return path[:i]
}

func joinPath(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

func indexPath(parent string, i int) string {
	return parent + "[" + strconv.Itoa(i) + "]"
}

// structural is a problem in the shape of the document that the TOML decoder
// accepts but that would silently put values where the operator did not mean
// them.
type structural struct {
	line int
	msg  string
}

// indexTOML walks the document's expressions. Array-table headers count
// their occurrences so that every key below one gets the index of the
// element it belongs to; that index is what the decoded slices use, so a
// validation error on service 2 finds service 2's line. The document has
// already been decoded successfully, so a parser error here is not
// reported again.
//
// It also reports headers that TOML accepts but the decoder would quietly
// reinterpret: `[service]` for `[[service]]`, or `[[service.backend]]`
// before any `[[service]]`. root is the type the document decodes into.
func indexTOML(data []byte, root reflect.Type) (*lineIndex, []structural) {
	x := newLineIndex(data)
	var issues []structural
	arrays := make(map[string]int) // resolved array-table path -> elements so far
	current := ""
	var p unstable.Parser
	p.Reset(data)
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.KeyValue:
			path := current
			line := 0
			it := e.Key()
			for it.Next() {
				k := it.Node()
				line = x.lineAt(int(k.Raw.Offset))
				path = joinPath(path, string(k.Data))
				x.add(path, line)
			}
			x.value(path, e.Value(), line)
		case unstable.Table, unstable.ArrayTable:
			var parts []string
			line := 0
			it := e.Key()
			for it.Next() {
				k := it.Node()
				line = x.lineAt(int(k.Raw.Offset))
				parts = append(parts, string(k.Data))
			}
			array := e.Kind == unstable.ArrayTable
			if msg := headerShape(root, parts, array, arrays); msg != "" {
				issues = append(issues, structural{line, msg})
			}
			current = x.header(parts, array, line, arrays)
		}
	}
	return x, issues
}

// headerShape checks a table header against the schema: arrays of tables
// must be written with double brackets and opened before their sub-tables.
func headerShape(root reflect.Type, parts []string, array bool, arrays map[string]int) string {
	t := root
	resolved := ""
	for i, part := range parts {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return ""
		}
		f, ok := fieldByTag(t, "toml", part)
		if !ok {
			return "" // an unknown table: the decoder reports it
		}
		name := strings.Join(parts[:i+1], ".")
		resolved = joinPath(resolved, part)
		last := i == len(parts)-1
		if f.Type.Kind() == reflect.Slice {
			if last && !array {
				return fmt.Sprintf("%s must be written [[%s]]: each one is an element of an array of tables", headerText(parts, false), name)
			}
			if !last {
				n := arrays[resolved]
				if n == 0 {
					return fmt.Sprintf("%s is not inside a [[%s]]: add a [[%s]] header above it", headerText(parts, array), name, name)
				}
				resolved = indexPath(resolved, n-1)
			}
			t = f.Type.Elem()
			continue
		}
		t = f.Type
	}
	return ""
}

// headerText writes a table header the way it appears in a document.
func headerText(parts []string, array bool) string {
	if array {
		return "[[" + strings.Join(parts, ".") + "]]"
	}
	return "[" + strings.Join(parts, ".") + "]"
}

// header resolves a table header to its indexed path: every component that
// names an array of tables refers to that array's latest element, and an
// array-table header opens a new element.
func (x *lineIndex) header(parts []string, array bool, line int, arrays map[string]int) string {
	path := ""
	for i, part := range parts {
		path = joinPath(path, part)
		if array && i == len(parts)-1 {
			n := arrays[path]
			arrays[path] = n + 1
			x.add(path, line)
			path = indexPath(path, n)
		} else if n, ok := arrays[path]; ok && i < len(parts)-1 {
			path = indexPath(path, n-1)
		}
		x.add(path, line)
	}
	return path
}

// value indexes the elements of arrays and the keys of inline tables, so
// `source_ranges[2]` or an inline `backend = [{...}]` get lines too.
func (x *lineIndex) value(path string, n *unstable.Node, line int) {
	switch n.Kind {
	case unstable.Array:
		i := 0
		it := n.Children()
		for it.Next() {
			c := it.Node()
			cp := indexPath(path, i)
			x.add(cp, x.nodeLine(c, line))
			x.value(cp, c, x.nodeLine(c, line))
			i++
		}
	case unstable.InlineTable:
		it := n.Children()
		for it.Next() {
			kv := it.Node()
			if kv.Kind != unstable.KeyValue {
				continue
			}
			kp := path
			kl := line
			keys := kv.Key()
			for keys.Next() {
				k := keys.Node()
				kl = x.lineAt(int(k.Raw.Offset))
				kp = joinPath(kp, string(k.Data))
				x.add(kp, kl)
			}
			x.value(kp, kv.Value(), kl)
		}
	}
}

// nodeLine finds the line of a value node. Array nodes carry no position of
// their own, so they borrow their first element's.
func (x *lineIndex) nodeLine(n *unstable.Node, fallback int) int {
	if n.Kind == unstable.Array {
		if c := n.Child(); c.Valid() {
			return x.nodeLine(c, fallback)
		}
		return fallback
	}
	if n.Kind == unstable.InlineTable || n.Raw.Length > 0 {
		return x.lineAt(int(n.Raw.Offset))
	}
	return fallback
}

// jsonIssue is a problem found while walking a JSON document.
type jsonIssue struct {
	path string // where the problem is, for service/backend labels
	line int
	msg  string
}

// indexJSON walks a JSON document token by token, recording the line of
// every key and array element, and checks keys against the struct type the
// document decodes into. encoding/json stops at the first unknown field,
// gives it no position and matches names case-insensitively; walking the
// tokens ourselves reports every unknown or duplicate key with its line.
// A non-nil error is a syntax error: the document cannot be decoded at all.
func indexJSON(data []byte, t reflect.Type) (*lineIndex, []jsonIssue, *jsonIssue) {
	w := &jsonWalker{x: newLineIndex(data), dec: json.NewDecoder(bytes.NewReader(data))}
	w.dec.UseNumber()
	if err := w.walk("", t); err != nil {
		return w.x, nil, w.syntax(err, len(data))
	}
	if _, err := w.dec.Token(); err != io.EOF {
		line := w.x.lineAt(int(w.dec.InputOffset()))
		if err != nil {
			return w.x, nil, w.syntax(err, len(data))
		}
		return w.x, nil, &jsonIssue{line: line, msg: "unexpected data after the service object: a definition holds exactly one JSON object"}
	}
	return w.x, w.issues, nil
}

type jsonWalker struct {
	x      *lineIndex
	dec    *json.Decoder
	issues []jsonIssue
}

func (w *jsonWalker) syntax(err error, size int) *jsonIssue {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return &jsonIssue{line: w.x.lineAt(int(se.Offset)), msg: "JSON syntax error: " + se.Error()}
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return &jsonIssue{line: w.x.lineAt(size), msg: "JSON document ends early: close every object and array"}
	}
	return &jsonIssue{line: w.x.lineAt(int(w.dec.InputOffset())), msg: "JSON syntax error: " + err.Error()}
}

// walk reads one value at path. t is the Go type it decodes into; nil (or
// an interface) means its content is not checked here but by the typed
// conversions after decoding.
func (w *jsonWalker) walk(path string, t reflect.Type) error {
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	line := w.x.lineAt(int(w.dec.InputOffset()))
	w.x.add(path, line)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	switch d {
	case '{':
		seen := make(map[string]bool)
		for w.dec.More() {
			ktok, err := w.dec.Token()
			if err != nil {
				return err
			}
			key, _ := ktok.(string)
			kline := w.x.lineAt(int(w.dec.InputOffset()))
			kp := joinPath(path, key)
			var ft reflect.Type
			if t != nil && t.Kind() == reflect.Struct {
				f, found := fieldByTag(t, "json", key)
				if !found {
					w.issues = append(w.issues, jsonIssue{path: path, line: kline, msg: unknownKeyMsg("key", key, path, knownTags(t, "json"))})
				} else {
					ft = f.Type
				}
			}
			if seen[key] {
				w.issues = append(w.issues, jsonIssue{path: path, line: kline, msg: fmt.Sprintf("duplicate key %q: keep only one", key)})
			}
			seen[key] = true
			w.x.add(kp, kline)
			if err := w.walk(kp, ft); err != nil {
				return err
			}
		}
	case '[':
		var et reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			et = t.Elem()
		}
		for i := 0; w.dec.More(); i++ {
			if err := w.walk(indexPath(path, i), et); err != nil {
				return err
			}
		}
	}
	_, err = w.dec.Token() // the closing delimiter
	return err
}

// fieldByTag finds the struct field whose tag (toml or json) is exactly
// name. Header checks call it for every table of the document, so each
// struct's tags are read once and kept.
func fieldByTag(t reflect.Type, tag, name string) (reflect.StructField, bool) {
	key := fieldCacheKey{t, tag}
	m, ok := fieldCache.Load(key)
	if !ok {
		fields := make(map[string]reflect.StructField)
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if n := tagName(f, tag); n != "" && n != "-" {
				fields[n] = f
			}
		}
		m, _ = fieldCache.LoadOrStore(key, fields)
	}
	f, ok := m.(map[string]reflect.StructField)[name]
	return f, ok
}

type fieldCacheKey struct {
	t   reflect.Type
	tag string
}

var fieldCache sync.Map // fieldCacheKey -> map[string]reflect.StructField

func tagName(f reflect.StructField, tag string) string {
	name, _, _ := strings.Cut(f.Tag.Get(tag), ",")
	return name
}

// knownTags lists the keys a table accepts, for "did you mean" hints.
func knownTags(t reflect.Type, tag string) []string {
	var names []string
	for i := 0; i < t.NumField(); i++ {
		if n := tagName(t.Field(i), tag); n != "" && n != "-" {
			names = append(names, n)
		}
	}
	return names
}

// tableType follows a key path (without indexes) from root to the struct
// type of the table it names, or nil when the path leaves the schema.
func tableType(root reflect.Type, tag string, path []string) reflect.Type {
	t := root
	for _, p := range path {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return nil
		}
		f, ok := fieldByTag(t, tag, p)
		if !ok {
			return nil
		}
		t = f.Type
	}
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	return t
}

// unknownKeyMsg says which key is not part of the schema, where, and which
// known key was probably meant.
func unknownKeyMsg(noun, key, table string, known []string) string {
	where := "at the top level"
	if table != "" {
		where = "in " + table
	}
	msg := fmt.Sprintf("unknown %s %q %s", noun, key, where)
	if s := closest(key, known); s != "" {
		return msg + fmt.Sprintf(": did you mean %q?", s)
	}
	return msg + ": remove it or fix its spelling (etc/l4lb.toml lists every key)"
}

// closest returns the known key within a small edit distance of key, so a
// typo gets a concrete correction instead of a list to scan.
func closest(key string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		if d := editDistance(key, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
