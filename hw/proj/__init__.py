"""The units' projection skeleton, shared by the KDA, MLA and MoE units (issue 49 item 3,
issue 45 item 4): what every unit does to stream a matrix from the weight port through the
matrix-vector engine (hw/arith/matvec.py).

- ``sequencer.RowBeatCounter``  the (row, beat) position inside one matrix (a phase);
- ``sequencer.ProjectionSequencer`` a fixed list of matrices walked op by op, row by row,
  beat by beat (the KDA and MLA units' feeder), on a RowBeatCounter;
- ``requests.RequestTable``    the weight requests of a token: a table of (address, beats)
  per layer, opened group by group by the unit's phase control;
- ``results.PendingRows``      rows issued to the engine and not yet stored: ``drained``;
- ``results.GatedProduct``     a requantised value times its gate, rounded (the KDA's o
  norm output and the MLA's W_uv rows).

Nothing here imports the chip (hw/chip): a block builds on these without it."""
