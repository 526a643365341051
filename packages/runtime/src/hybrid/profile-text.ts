/** The text `hybridgen profile-kmin` teacher-forces by default, and the one apps/bench/src/eval/hybrid-eval.ts and selector-eval.ts measure; written for this project in the TinyStories style (simple words, a small plot, repetition). */
export const DEFAULT_PROFILE_TEXT = `Once upon a time, in a small town near a big green hill, there lived a little girl named Mia. \
Mia had a red ball that she loved very much. Every morning she took the red ball to the park and played with her dog, Max. \
Max was brown and fluffy, and he liked to run after the ball. One sunny day, Mia threw the ball very high. \
The ball went over the fence and into the garden of old Mr. Brown. Mia was sad. "My ball is gone," she said. \
Max barked and wagged his tail. Mia walked to the gate and knocked on the door. Mr. Brown opened the door and smiled. \
"Hello, little one. Is this your ball?" he asked. He held the red ball in his big hands. Mia nodded and said, "Yes, thank you!" \
Mr. Brown gave her the ball and a cookie too. Mia and Max went back to the park. They played until the sun went down. \
That night, Mia told her mom about kind Mr. Brown. Her mom hugged her and said, "It is good to say thank you." \
The next day, Mia made a picture of Max and the red ball, and she gave it to Mr. Brown. He put it on his wall and smiled every time he saw it.`;
