// Package dragonv1 is the generated Go code of the dragon.v1 protobuf
// package (peer.proto, device.proto, documents.proto). Do not edit the *.pb.go files:
// change the .proto files and run `make proto`.
//
// Distributions travel as opaque bytes (Draft.distribution); package codec
// defines those bytes and is the only code that reads or writes them.
package dragonv1
